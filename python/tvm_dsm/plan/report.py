"""The per-level table every plan's ``explain()`` prints."""

from __future__ import annotations


def level_table(summary: str, nbytes: dict[str, int], seconds: dict[str, float],
                predicted_us: float) -> str:
    """``summary``, then bytes and predicted time per memory level (levels without bytes, such as
    compute or latency terms, show their time only), then the predicted total."""
    lines = [summary, "  level    bytes            time (us)"]
    for level, t in seconds.items():
        moved = f"{nbytes[level]:>14,}" if level in nbytes else " " * 14
        lines.append(f"  {level:<7}  {moved}   {t * 1e6:9.2f}")
    lines.append(f"  predicted: {predicted_us:.1f} us")
    return "\n".join(lines)
