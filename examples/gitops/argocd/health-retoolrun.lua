-- Argo CD health check for retool.dev/RetoolRun (install: see argocd-cm-patch.yaml).
-- Reads the kstatus conditions the operator writes (the ones Flux reads too): Healthy when
-- Ready is True (every stage succeeded), Degraded when Stalled is True (a stage failed, the spec
-- is invalid, or the API server refuses a child - with its message), Suspended while
-- spec.suspend is set (or the operator reports Suspended), Progressing otherwise - including
-- before the operator has written any status. Statuses without conditions fall back to phase.
local hs = {}

local function condition(status, wanted)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == wanted then
      return c
    end
  end
  return nil
end

local function true_message(status, wanted)
  local c = condition(status, wanted)
  if c ~= nil and c.status == "True" and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return nil
end

local function is_true(status, wanted)
  local c = condition(status, wanted)
  return c ~= nil and c.status == "True"
end

local suspended = obj.spec ~= nil and obj.spec.suspend == true
local status = obj.status

if status == nil or status.phase == nil then
  if suspended then
    hs.status = "Suspended"
    hs.message = "Suspended before the operator started it"
  else
    hs.status = "Progressing"
    hs.message = "Waiting for the ReTool operator"
  end
  return hs
end

local phase = status.phase
if is_true(status, "Ready") or phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = "Succeeded"
  if status.score ~= nil then
    hs.message = "Succeeded, AIME score " .. tostring(status.score)
  end
elseif is_true(status, "Stalled") or phase == "Failed" then
  hs.status = "Degraded"
  hs.message = true_message(status, "Stalled") or true_message(status, "Failed") or status.message or "Failed"
elseif phase == "Suspended" or suspended then
  hs.status = "Suspended"
  hs.message = status.message or "Suspended (spec.suspend is true)"
else
  hs.status = "Progressing"
  hs.message = phase
  if status.progress ~= nil and status.progress ~= "" then
    hs.message = phase .. ": " .. status.progress
  end
end
return hs
