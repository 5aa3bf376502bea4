"""`tpuserve plan --fit` (analytic) against the simulated plan, on the three published cases.

For every slice both call serving, the fit check's capacity per replica against the fleet
model's (from the committed results of bench/fleet_results/2026-12-07), and each one's
choice. Prints one row per slice and the median and worst |difference|::

    .venv/bin/python bench/plan_fit_vs_sim.py
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
R = ROOT / "bench" / "fleet_results" / "2026-12-07"
CASES = {
    "chat": ["--model", "llama-3.1-8b", "--preset", "chat", "--rate", "100", "--ttft-p99", "1",
             "--itl-p99", "0.05", "--generations", "v6e,v5e"],
    "long-document": ["--model", "qwen3-8b", "--preset", "long-document", "--rate", "20",
                      "--ttft-p99", "2", "--itl-p99", "0.05", "--generations", "v6e,v5e"],
    "tokens-per-day": ["--model", "llama-3.1-8b", "--preset", "agentic", "--tokens-per-day",
                       "6e9", "--ttft-p99", "5", "--itl-p99", "0.1", "--generations", "v6e"],
}  # fmt: skip


def main() -> None:
    errors: list[float] = []
    print("| case | slice | fit req/s per replica | simulated | fit / simulated - 1 |")
    print("|---|---|---|---|---|")
    choices = []
    for case, argv in CASES.items():
        sim = json.loads((R / f"plan-{case}.json").read_text())
        command = [str(ROOT / ".venv/bin/tpuserve"), "plan", "--fit", "--json", *argv]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        fit = json.loads(done.stdout)
        fitted = {c["slice"]: c for c in fit["candidates"]}
        for s in sim["candidates"]:
            f = fitted.get(s["slice"])
            if not (s["fits"] and s["capacity_rps_per_replica"] and f and f["fits"]):
                continue
            a = f["operating_point"]["requests_per_second"]
            b = s["capacity_rps_per_replica"]
            errors.append(abs(a / b - 1))
            print(f"| {case} | {s['slice']} | {a:.2f} | {b:.2f} | {a / b - 1:+.0%} |")
        choices.append(f"{case}: fit {fit['choice']} ({fit['ranked_by']}), "
                       f"simulated {sim['choice']}")  # fmt: skip
    errors.sort()
    print(f"\n{len(errors)} slices: median |difference| {errors[len(errors) // 2]:.0%}, "
          f"worst {errors[-1]:.0%}")  # fmt: skip
    print("\n".join(choices))


if __name__ == "__main__":
    main()
