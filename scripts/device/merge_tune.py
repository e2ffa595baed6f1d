"""Merge tune results: `python3 scripts/device/merge_tune.py OUT NEW BASE`. OUT takes NEW's header
and its tuned settings, and BASE's for the methods NEW did not tune; `merged_from` says which
method came from which file (e2e reads only `tuned`)."""
import json
import sys

out_path, new_path, base_path = sys.argv[1:4]
with open(new_path, encoding="utf-8") as f:
    new = json.load(f)
with open(base_path, encoding="utf-8") as f:
    base = json.load(f)
kept = {k: v for k, v in base["tuned"].items() if k not in new["tuned"]}
merged = dict(new)
merged["tuned"] = {**new["tuned"], **kept}
merged["command"] = "scripts/device/merge_tune.py of the two files named in merged_from"
merged["merged_from"] = [f"{new_path}: {', '.join(new['tuned'])} ({new['command']})",
                         f"{base_path}: {', '.join(kept) or 'nothing'} (not re-tuned)"]
merged["complete"] = True
with open(out_path, "w", encoding="utf-8") as f:
    json.dump(merged, f, indent=1)
    f.write("\n")
print(f"wrote {out_path}: " + ", ".join(f"{k} {v['gamma']}/{v['sparsity']}" for k, v in merged["tuned"].items()))
