"""The certificate's 'readers' on every family checkpoint (4.3 or 3.9, float64/float32): holds, gap."""
import sys, os, torch, rs_interp as ri
sys.path.insert(0, "/work/wt-red/tests")
from hf_families import save_checkpoint
dt = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "float64")
for fam in sys.argv[2:]:
    d = f"/tmp/red_ckpt/{fam}"
    if not os.path.exists(d + "/config.json"):
        os.makedirs(d, exist_ok=True); save_checkpoint(fam, d)
    try:
        m = ri.load_pretrained(d, dtype=dt)
    except ValueError as e:
        print(fam, "load refused:", str(e)[:100]); continue
    idn = ri.certify(m)["readers"]
    print(fam, dt, "readers holds", idn.holds if hasattr(idn, "holds") else idn, "gap", getattr(idn, "gap", None), (getattr(idn, "why", "") or "")[:100])
