"""What reading a JSON value costs the json transform (consumers.engine.json_map.loads), against orjson alone and
json.loads, for three kinds of records:

  short      the mapping benchmark's orders: no number longer than 15 characters (orjson's fast path)
  floats     doubles as most producers write them, their shortest text of 16-17 digits: each long number is
             checked (`_orjson_exact`), then orjson reads the value
  decimals   numbers longer than a float holds (a BigDecimal written as a JSON number): json.loads reads them,
             each such number as a Decimal, so no digit is lost

orjson alone is the speed json_map.loads had before it kept long numbers exact (it rounded the third kind to a
float). Each way runs `--repeat` times over the same records; the best run counts.

Usage (from the project root; needs no database or broker):
  .venv/bin/python bench/bench_json_numbers.py [--records 20000] [--repeat 5]
"""
import argparse
import json
import random
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from consumers.engine.json_map import loads  # noqa: E402 - after the project root is on the path


def records(kind: str, n: int, rng: random.Random) -> list[bytes]:
    if kind == "short":
        return [json.dumps({"id": k, "customer": {"name": f"customer {k % 9973}", "tier": "gold"},
                            "amount": round(rng.uniform(1, 999), 2), "at": "2026-11-01T12:00:00Z",
                            "meta": {"source": "web", "n": k}}).encode() for k in range(n)]
    if kind == "floats":
        return [json.dumps({"id": k, "reading": rng.random() * 1000, "ratio": rng.random(),
                            "at": 1_714_559_400_000 + k}).encode() for k in range(n)]
    return [(f'{{"id": {k}, "amount": {rng.randrange(10 ** 20)}.{rng.randrange(10 ** 12):012d}, '
             f'"at": {1_714_559_400_000 + k}}}').encode() for k in range(n)]


def best_rate(read, values: list[bytes], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for value in values:
            read(value)
        best = min(best, time.perf_counter() - start)
    return len(values) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(1)
    print(f"{'records':10} {'json_map.loads':>16} {'orjson.loads':>14} {'json.loads':>12}   (records/s)")
    for kind in ("short", "floats", "decimals"):
        values = records(kind, args.records, rng)
        rates = [best_rate(read, values, args.repeat) for read in (loads, orjson.loads, json.loads)]
        print(f"{kind:10} " + " ".join(f"{rate:>{width},.0f}" for rate, width in zip(rates, (16, 14, 12), strict=True))
              + f"   json_map/orjson {rates[0] / rates[1]:.2f}x")


if __name__ == "__main__":
    main()
