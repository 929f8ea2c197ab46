"""What every planner returns: a configuration's predicted bytes and time per level."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    """Predicted traffic (bytes per memory level) and time (per level and in total) of one
    configuration; each schedule family's plan adds the configuration and says what it is."""

    bytes: dict[str, int]
    seconds: dict[str, float]
    predicted_us: float

    def summary(self) -> str:
        """One line naming the configuration (tiles, cluster, grid)."""
        raise NotImplementedError

    def explain(self) -> str:
        """The summary, then bytes and predicted time per level (levels without bytes, such as
        compute or latency terms, show their time only), then the predicted total."""
        lines = [self.summary(), "  level    bytes            time (us)"]
        for level, t in self.seconds.items():
            moved = f"{self.bytes[level]:>14,}" if level in self.bytes else " " * 14
            lines.append(f"  {level:<7}  {moved}   {t * 1e6:9.2f}")
        lines.append(f"  predicted: {self.predicted_us:.1f} us")
        return "\n".join(lines)
