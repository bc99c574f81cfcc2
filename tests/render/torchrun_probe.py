"""What one torchrun worker sees: run by the ray_torchrun test as ``-m tests.render.torchrun_probe DIR``."""

import json
import os
import sys
from pathlib import Path

keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RETOOL_PROBE")
Path(sys.argv[1], f"rank{os.environ['RANK']}.json").write_text(json.dumps({k: os.environ.get(k) for k in keys}))
