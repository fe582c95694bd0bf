"""The time-to-first-token figures as the READMEs quote them (`<!-- bench:ttft -->`, `<!-- bench:ttft-new-session
-->`), from the summary of the results file `python -m bench.ttft` writes; `bench.quote` reads it and says where it
came from. A peer's row and comparison appear when the run measured the peer (not with `--no-peers`)."""

from __future__ import annotations

from typing import Any


def _yes(ok: bool) -> str:
    return "met" if ok else "not met"


def ttft_block(figures: dict[str, Any], where: str) -> str:
    """The `bench:ttft` block: every arm's first and next message, corral against the bare call, the coupled
    design and each peer the run measured."""
    arms, goals = figures["arms"], figures["goals"]
    label = {
        "direct": "direct (the SDK straight to the model server: the floor)",
        "coupled": "coupled (a sandbox and a clone before the first model call)",
        "decoupled": "decoupled (corral: the sandbox only when a tool needs it)",
        "actant": "actant (a peer Temporal runtime, its worker and client in one process)",
    }
    peers = figures.get("peers", [])
    rows = [
        f"| {label[arm]} | {arms[arm]['p50']:.3f} | {arms[arm]['p95']:.3f} | {arms[arm]['next_p50']:.3f} "
        f"| {arms[arm]['next_p95']:.3f} |"
        for arm in ("direct", "coupled", "decoupled", *peers)
    ]
    d, c, x = arms["decoupled"], arms["coupled"], arms["direct"]
    ratio = (d["p50"] / x["p50"], d["p95"] / x["p95"])
    next_ratio = (d["next_p50"] / x["next_p50"], d["next_p95"] / x["next_p95"])
    reduction = (100 * (1 - d["p50"] / c["p50"]), 100 * (1 - d["p95"] / c["p95"]))
    return "\n".join(
        [
            "",
            f"From {where}: the model server's first token after {figures['first_token_latency']:g} s, then "
            f"{figures['tokens_per_second']:g} tokens/s; {figures['sessions_per_arm']} sessions per arm, "
            f"{figures['concurrency']} at a time; {figures['model_workers']} model worker processes.",
            "",
            "| arm | first message p50 s | p95 s | next message p50 s | p95 s |",
            "| --- | ---: | ---: | ---: | ---: |",
            *rows,
            "",
            f"- **Decoupled against direct**, a new session: {ratio[0]:.2f} at p50 (goal ≤ {goals['ratio_p50']:.2f}, "
            f"{_yes(ratio[0] <= goals['ratio_p50'])}) and {ratio[1]:.2f} at p95 (goal ≤ {goals['ratio_p95']:.2f}, "
            f"{_yes(ratio[1] <= goals['ratio_p95'])}); the next message: {next_ratio[0]:.2f} and {next_ratio[1]:.2f}. "
            f"The harness adds {1000 * (d['p50'] - x['p50']):.0f} ms to a new session's first token at p50.",
            f"- **Decoupled against coupled**, TTFT is {reduction[0]:.1f}% lower at p50 (goal ≥ "
            f"{goals['reduction_p50']:.0f}%, {_yes(reduction[0] >= goals['reduction_p50'])}) and {reduction[1]:.1f}% "
            f"lower at p95 (goal ≥ {goals['reduction_p95']:.0f}%, {_yes(reduction[1] >= goals['reduction_p95'])}).",
            *(_beside_peer(peer, d, x, arms[peer]) for peer in peers),
            "",
        ]
    )


def _beside_peer(peer: str, ours: dict[str, float], direct: dict[str, float], theirs: dict[str, float]) -> str:
    """corral and a peer measured in the same run, each against the bare call."""

    def ratios(arm: dict[str, float], key: str) -> str:
        return f"{arm[key + 'p50'] / direct[key + 'p50']:.2f} / {arm[key + 'p95'] / direct[key + 'p95']:.2f}"

    ahead = ours["p50"] < theirs["p50"] and ours["p95"] < theirs["p95"]
    return (
        f"- **Beside {peer}** in the same run, against the bare call (p50 / p95): a new session {ratios(ours, '')} "
        f"for corral, {ratios(theirs, '')} for {peer} (goal: ahead at both, {_yes(ahead)}); the next message "
        f"{ratios(ours, 'next_')} against {ratios(theirs, 'next_')}."
    )


def new_session_line(figures: dict[str, Any], where: str) -> str:
    """The `bench:ttft-new-session` line: a new session's first token against the bare call (issue 29's goal), and
    beside each peer the run measured."""
    arms, goals = figures["arms"], figures["goals"]

    def ratio(arm: str, at: str) -> float:
        return float(arms[arm][at] / arms["direct"][at])

    ours = (ratio("decoupled", "p50"), ratio("decoupled", "p95"))
    text = (
        f"A new session's first token ({where}): {ours[0]:.2f}x the bare "
        f"call to the model at p50 (goal ≤ {goals['ratio_p50']:.2f}, {_yes(ours[0] <= goals['ratio_p50'])}) and "
        f"{ours[1]:.2f}x at p95 (goal ≤ {goals['ratio_p95']:.2f}, {_yes(ours[1] <= goals['ratio_p95'])})"
    )
    for peer in figures.get("peers", []):
        theirs = (ratio(peer, "p50"), ratio(peer, "p95"))
        ahead = ours[0] < theirs[0] and ours[1] < theirs[1]
        text += (
            f"; {peer}'s in the same run {theirs[0]:.2f}x and {theirs[1]:.2f}x (goal: corral ahead at both, "
            f"{_yes(ahead)})"
        )
    return text + "."
