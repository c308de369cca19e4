"""How often a five-run set of `kvgate bench vllm` meets the goal (kvgate's mean TTFT at most 0.95x
sglang-router's) when the routers are as the pooled runs measure them.

Per run, the log of the ratio kvgate / sglang-router of the two arms' mean TTFT in that run (the
runs are paired: same conversations, same engines, one after the other). A set's figure is the
geometric mean of its runs' ratios, as the bench's `paired_ratio` reports it. Two estimates of a
five-run set's chance to come out at or below 0.95:
- normal: the per-run log ratios' mean and sd over all pooled runs, a set's ~ N(mu, sd/sqrt 5);
- resampled: 100,000 sets of five runs drawn from the pooled runs with replacement.
And the per-run spread within sets against between them (a set's host and hour move every arm).
Usage: python power.py RUN_JSON... (the sets pooled in BENCHMARKS)."""
import json
import math
import random
import statistics as st
import sys

GOAL = 0.95


def per_run(paths, arm, column="ttft_mean_s"):
    sets = []
    for path in paths:
        routers = json.load(open(path))["routers"]
        if arm not in routers or "sglang" not in routers:
            continue
        sets.append([math.log(k[column] / s[column]) for k, s in zip(routers[arm]["runs"], routers["sglang"]["runs"])])
    return sets


def phi(x):
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def report(name, sets):
    runs = [r for s in sets for r in s]
    mu, sd = st.mean(runs), st.stdev(runs)
    n = 5
    goal = math.log(GOAL)
    p_normal = phi((goal - mu) / (sd / math.sqrt(n)))
    rng = random.Random(1)
    draws = 100_000
    hits = sum(st.fmean(rng.choices(runs, k=n)) <= goal for _ in range(draws))
    within = st.mean(st.pvariance(s) for s in sets if len(s) > 1)
    between = st.pvariance([st.mean(s) for s in sets])  # includes within/len(set): sets' means of 5-10 runs
    need = ((1.645 + 0.842) * sd / mu) ** 2 if mu < 0 else float("inf")
    print(f"{name}: {len(runs)} runs in {len(sets)} sets; ratio {math.exp(mu):.4f}, per-run sd of the log ratio {sd:.4f}")
    print(f"  a five-run set's figure: {math.exp(mu):.3f}, 68% of sets within {math.exp(mu - sd / math.sqrt(n)):.3f}-{math.exp(mu + sd / math.sqrt(n)):.3f}")
    print(f"  P(a five-run set <= {GOAL}): normal {p_normal:.2f}, resampled {hits / draws:.2f}")
    print(f"  the sets' own figures: {', '.join(f'{math.exp(st.mean(s)):.3f}' for s in sets)}; at or below {GOAL}: "
          f"{sum(st.mean(s) <= goal for s in sets)} of {len(sets)}")
    print(f"  log-ratio variance within sets {within:.4f}; of the sets' means {between:.4f} (from the within-set spread alone about {within / 5:.4f})")
    print(f"  runs to show kvgate ahead (ratio < 1, one-sided 5%, power 80%) at this mean: {need:.0f}")
    print(f"  true ratio a five-run set needs to meet the goal 80% of the time: {math.exp(goal - 0.842 * sd / math.sqrt(n)):.3f}")


if __name__ == "__main__":
    for arm in ("kvgate_precise", "kvgate_approximate"):
        report(arm, per_run(sys.argv[1:], arm))
        report(arm + " (vLLM's own TTFT)", per_run(sys.argv[1:], arm, "engine_ttft_mean_s"))
