-- Argo CD health check for retool.dev/RetoolRun (install: see argocd-cm-patch.yaml).
-- Healthy when the pipeline Succeeded, Degraded when it Failed, Suspended while spec.suspend
-- is set (or the operator reports Suspended), Progressing otherwise - including before the
-- operator has written any status.
local hs = {}

local function condition_message(status, wanted)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == wanted and c.status == "True" and c.message ~= nil and c.message ~= "" then
      return c.message
    end
  end
  return nil
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
if phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = "Succeeded"
  if status.score ~= nil then
    hs.message = "Succeeded, AIME score " .. tostring(status.score)
  end
elseif phase == "Failed" then
  hs.status = "Degraded"
  hs.message = condition_message(status, "Failed") or status.message or "Failed"
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
