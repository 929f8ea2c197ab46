"""Generated functions (:mod:`tvm_dsm.workloads.generated`) through the driver's schedule (a
family, else dlight), each checked against its float64 reference on the GPU.

``python -m tvm_dsm.gpu.suites.generated [--count 300] [--seed 0] --check`` lists the cases
with the family each gets (``tvm_dsm.plan``) or why it falls back, and counts per class.
"""

from __future__ import annotations

import argparse
import collections

from ...driver import plan, schedule
from ...errors import ClusterError
from ...workloads.generated import generate
from .base import Variant, nbytes_of

#: Cases of the GPU suite and their seed: 330 drawn, of which over 300 (the issue's acceptance) are not
#: known failures.
COUNT, SEED = 330, 0


def generated(count: int = COUNT, seed: int = SEED) -> list[Variant]:
    """A Variant per generated case, but those no schedule takes (printed with the reason)."""
    variants = []
    for case in generate(seed, count):
        try:
            mod = schedule(case.func).mod
        except ClusterError as err:
            print(f"refused {case.name}: {str(err).splitlines()[0]}")
            continue
        variants.append(Variant(
            name=case.name, workload="generated", mod=mod, args=case.args, bytes=nbytes_of(case.args),
            flops=case.flops, expect_correct=case.within_tolerance, peers=("torch_eager",),
            reference_kwargs=case.params,
            extra={"class": case.op_class, "style": case.style, "symbolic": case.symbolic},
        ))
    return variants


def family_of(func) -> str:
    """The family ``tvm_dsm.plan`` ranks ``func`` with, "fallback: <first line of why not>", or
    "crash: <the exception>" where planning raises anything but ClusterError."""
    try:
        return plan(func).family.name
    except ClusterError as err:
        return "fallback: " + str(err).strip().splitlines()[0]
    except Exception as err:  # noqa: BLE001  (listed, and counted per class, not hidden)
        return f"crash: {type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=COUNT)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--check", action="store_true", help="plan every case: its family or the fallback")
    args = parser.parse_args(argv)
    counts: dict = collections.defaultdict(collections.Counter)
    for case in generate(args.seed, args.count):
        family = family_of(case.func) if args.check else ""
        print(f"{case.name}  {family}")
        counts[case.op_class][family.partition(":")[0] or "cases"] += 1
    for op_class, families in counts.items():
        print(f"{op_class}: " + ", ".join(f"{name} {n}" for name, n in families.most_common()))


if __name__ == "__main__":
    main()
