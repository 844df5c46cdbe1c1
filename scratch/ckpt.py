import sys, os, torch
sys.path.insert(0, "/work/wt-red/tests")
from hf_families import save_checkpoint
root = "/tmp/red_ckpt"
for fam in sys.argv[1:]:
    d = f"{root}/{fam}"
    if not os.path.exists(d + "/config.json"):
        os.makedirs(d, exist_ok=True); save_checkpoint(fam, d)
