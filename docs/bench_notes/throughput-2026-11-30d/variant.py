"""pipeline_cpu with a route variant: python variant.py <answers|noanswers> --target router ..."""
import sys, argparse, yaml
from kvgate.tools.bench import pipeline_cpu as pc
orig = pc.kvgate_config
variant = sys.argv.pop(1)
def patched(*a, **k):
    path = orig(*a, **k)
    cfg = yaml.safe_load(path.read_text())
    if variant == "noanswers":
        cfg["routes"][0]["routing"]["prefix"]["record_answers"] = False
    path.write_text(yaml.safe_dump(cfg))
    return path
pc.kvgate_config = patched
p = argparse.ArgumentParser(); pc.add_arguments(p)
row = pc.run(p.parse_args())
print(variant, row["cpu_ms_per_request"])
