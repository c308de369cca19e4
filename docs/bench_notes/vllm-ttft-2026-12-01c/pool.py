"""Each kvgate mode against sglang-router over this host's sets: the geometric mean of the
run-by-run TTFT ratios with a Student's t interval (kvgate.tools.bench.vllm_arena_stats.paired_ratio),
the same over first and later turns from each run's request records, and how many kvgate requests
expected the uncached tokens vLLM reported. Usage: python pool.py set.json [set.json ...]"""

import json
import sys

from kvgate.tools.bench.vllm_arena_stats import paired_ratio


def turn_means(run):
    first, later = [], []
    for rec in run["request_records"]:
        if rec.get("ttft_s") is not None:
            (first if rec.get("t", 0) == 0 else later).append(rec["ttft_s"])
    return (sum(first) / len(first) if first else None, sum(later) / len(later) if later else None)


def main():
    for arm in ("kvgate_precise", "kvgate_approximate"):
        k_all, s_all, kf, sf, kl, sl, agree, total = [], [], [], [], [], [], 0, 0
        for path in sys.argv[1:]:
            routers = json.load(open(path))["routers"]
            k, s = routers[arm]["runs"], routers["sglang"]["runs"]
            print(arm, path, "set", paired_ratio([r["ttft_mean_s"] for r in k], [r["ttft_mean_s"] for r in s]))
            k_all += [r["ttft_mean_s"] for r in k]
            s_all += [r["ttft_mean_s"] for r in s]
            for rk, rs in zip(k, s):
                (fk, lk), (fs, ls) = turn_means(rk), turn_means(rs)
                if None not in (fk, fs):
                    kf.append(fk)
                    sf.append(fs)
                if None not in (lk, ls):
                    kl.append(lk)
                    sl.append(ls)
                for rec in rk["request_records"]:
                    total += 1
                    agree += rec.get("expected_uncached") == rec.get("uncached")
        print(arm, "pooled", len(k_all), "runs:", paired_ratio(k_all, s_all))
        print(arm, "first turns:", paired_ratio(kf, sf), "| later turns:", paired_ratio(kl, sl))
        print(arm, "requests whose expected uncached tokens equal vLLM's:", agree, "of", total)


if __name__ == "__main__":
    main()
