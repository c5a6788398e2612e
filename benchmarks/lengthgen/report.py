"""results.md and results.png of the study: per task, exact match by length (runs that passed the in-distribution
gate, pooled over seeds, with 95% Wilson intervals), the runs that failed the gate, and the MRR ranking beside
Kazemnejad et al.'s numbers (`hf_posenc.evaluation.lengthgen.ranking`)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from hf_posenc import plots
from hf_posenc.analysis.logit_terms import TERMS
from hf_posenc.evaluation.lengthgen.ranking import PAPER, PAPER_ARMS, mrr, paper_ood, ranks
from hf_posenc.stats import wilson

Run = dict[str, Any]


def counted(runs: list[Run], arm: str, task: str) -> list[Run]:
    """The runs of (arm, task) that passed the gate: the only ones the tables and ranking read."""
    return [r for r in runs if r["arm"] == arm and r["task"] == task and r["gate"]]


def pooled_curve(mine: list[Run]) -> dict[int, tuple[float, float, float]]:
    """length -> (exact match, low, high) over the runs' examples pooled (the seeds' hits and n added)."""
    hits: dict[int, list[int]] = {}
    for r in mine:
        for n, c in r["ood_by_length"].items():
            if "n" in c:
                got = hits.setdefault(int(n), [0, 0])
                got[0] += round(c["exact_match"] * c["n"])
                got[1] += c["n"]
    return {n: (h / total, *wilson(h, total)) for n, (h, total) in sorted(hits.items())}


def ood_score(mine: list[Run]) -> float | None:
    """Mean over the counted seeds of the pooled out-of-distribution exact match (None: no counted run)."""
    values = [r["ood"]["exact_match"] for r in mine if r["ood"]]
    return statistics.mean(values) if values else None


def columns(runs: list[Run], arms: list[str], tasks: list[str], seeds: list[int],
            gated: bool = True) -> dict[str, dict[str, float]]:
    """One ranking column per (task, seed), as their notebook makes one per task split and seed: each arm's
    out-of-distribution exact match in that run, or -1 (last) where the run failed the gate (`gated`) or has not
    run. A column where no arm's run counted ranks nothing and is left out."""
    table = {}
    for task in tasks:
        for seed in seeds:
            mine = {arm: [r for r in (counted(runs, arm, task) if gated else
                                      [r for r in runs if r["arm"] == arm and r["task"] == task])
                          if r["seed"] == seed and r["ood"]] for arm in arms}
            if any(mine.values()):
                table[f"{task}/seed {seed}"] = {arm: got[0]["ood"]["exact_match"] if got else -1.0
                                                for arm, got in mine.items()}
    return table


def ranking_table(runs: list[Run], arms: list[str], tasks: list[str],
                  seeds: list[int]) -> tuple[dict[str, float], list[str]]:
    """MRR of these arms over the (task, seed) columns (`columns`), and those columns; ({}, []) when none."""
    table = columns(runs, arms, tasks, seeds)
    return (mrr(table), list(table)) if table else ({}, [])


def paper_ranking(runs: list[Run], arms: list[str], tasks: list[str]) -> tuple[list[str], dict[str, float], list[str]]:
    """Their five schemes' arms that ran, their MRR over every (task, seed) column, and those columns."""
    ours = [a for a in PAPER_ARMS.values() if a in arms]
    return (ours, *ranking_table(runs, ours, tasks, sorted({r["seed"] for r in runs})))


def seed_mrr(runs: list[Run], arms: list[str], tasks: list[str], gated: bool) -> dict[int, dict[str, float]]:
    """seed -> the arms' MRR over that seed's task columns: a ranking per seed, to see which orders the seeds share."""
    seeds = sorted({r["seed"] for r in runs if r["arm"] in arms})
    return {seed: mrr(table) for seed in seeds if (table := columns(runs, arms, tasks, [seed], gated))}


def decided(by_seed: list[dict[int, dict[str, float]]], arms: list[str]) -> tuple[list[str], list[str]]:
    """('A > B' where A's MRR beats B's in every seed of every ranking given, 'A ? B' for the other pairs): an
    order is stated only where no seed and no choice of gate reverses or ties it."""
    sure, open_ = [], []
    for i, a in enumerate(arms):
        for b in arms[i + 1:]:
            signs = {(m[a] > m[b]) - (m[a] < m[b]) for ranking in by_seed for m in ranking.values()}
            if signs == {1}:
                sure.append(f"{a} > {b}")
            elif signs == {-1}:
                sure.append(f"{b} > {a}")
            else:
                open_.append(f"{a} ? {b}")
    return sure, open_


def headline(runs: list[Run], tasks: list[str]) -> list[str]:
    """Their five schemes' MRR with and without the in-distribution gate, each seed's ranks beside it, and the
    orders every seed and both gate choices agree on: what the study can say that neither decides."""
    arms = [a for a in PAPER_ARMS.values() if any(r["arm"] == a for r in runs)]
    seeds = sorted({r["seed"] for r in runs if r["arm"] in arms})
    gated, ungated = (ranking_table(runs, arms, tasks, seeds) if g else
                      (mrr(t), list(t)) if (t := columns(runs, arms, tasks, seeds, gated=False)) else ({}, [])
                      for g in (True, False))
    if not gated[0] or not ungated[0]:
        return ["no counted run of their schemes: no headline"]
    per_seed = {True: seed_mrr(runs, arms, tasks, True), False: seed_mrr(runs, arms, tasks, False)}
    seed_ranks = {g: {seed: ranks(m) for seed, m in per.items()} for g, per in per_seed.items()}
    names = {arm: scheme for scheme, arm in PAPER_ARMS.items()}
    lines = [f"| scheme | MRR, gated ({len(gated[1])} columns) | MRR, no gate ({len(ungated[1])} columns) | "
             f"rank by seed, gated ({', '.join(map(str, seeds))}) | rank by seed, no gate |", "|---|---|---|---|---|"]
    for arm in sorted(arms, key=lambda a: -gated[0][a]):
        by = {g: ", ".join(str(seed_ranks[g][seed][arm]) if seed in seed_ranks[g] else "–" for seed in seeds)
              for g in (True, False)}
        lines.append(f"| {names[arm]} ({arm}) | {gated[0][arm]:.2f} | {ungated[0][arm]:.2f} | {by[True]} | "
                     f"{by[False]} |")
    sure, open_ = decided(list(per_seed.values()), arms)
    rename = lambda pair: " ".join(names.get(word, word) for word in pair.split())  # noqa: E731
    return lines + ["", "Orders every seed agrees on, with the gate and without: "
                    + ("; ".join(map(rename, sure)) or "none") + ".",
                    "Undecided (a seed or the gate reverses or ties them): " + ("; ".join(map(rename, open_)) or "none")
                    + "."]


def task_table(runs: list[Run], arms: list[str], task: str) -> list[str]:
    lines = [f"### {task}", "", "| arm | runs counted / run | in-distribution (mean) | out of distribution (pooled, "
             "95% CI) | shortest test length | longest test length |", "|---|---|---|---|---|---|"]
    for arm in arms:
        every = [r for r in runs if r["arm"] == arm and r["task"] == task]
        if not every:
            continue
        mine = counted(runs, arm, task)
        curve = pooled_curve(mine)
        iid = statistics.mean(r["iid"]["exact_match"] for r in every)
        if curve:
            hits = sum(round(r["ood"]["exact_match"] * r["ood"]["n"]) for r in mine if r["ood"])
            n = sum(r["ood"]["n"] for r in mine if r["ood"])
            low, high = wilson(hits, n)
            first, last = curve[min(curve)], curve[max(curve)]
            cells = [f"{hits / n:.2f} [{low:.2f}, {high:.2f}] (n={n})", f"{first[0]:.2f}", f"{last[0]:.2f}"]
        else:
            cells = ["no run passed the gate", "–", "–"]
        lines.append(f"| {arm} | {len(mine)} / {len(every)} | {iid:.3f} | " + " | ".join(cells) + " |")
    return lines


def geometry_table(runs: list[Run], arms: list[str], tasks: list[str]) -> list[str]:
    """For the arms that add position vectors to the tokens, in the runs that passed the gate (means over seeds):
    how much of the positions' energy lies in the token embeddings' subspace and their median principal angle to it,
    each beside random subspaces of the same sizes, and layer 0's four attention terms (softmax-relevant shares; the
    rest of the logits' variation is the query bias against keys' content and position, GPT-2's q/k biases)."""
    head = ["| arm | task | runs | position energy in token subspace (random) | median angle, deg (random) | "
            "content-content | content-position | position-content | position-position | query bias (the rest) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for arm in arms:
        for task in tasks:
            geo = [r["geometry"] for r in counted(runs, arm, task) if r.get("geometry")]
            if not geo:
                continue
            mean = lambda key: statistics.mean(g[key] for g in geo)  # noqa: E731
            terms = [statistics.mean(g["four_terms"][t] for g in geo) for t in TERMS]
            rows.append(f"| {arm} | {task} | {len(geo)} | {mean('position_energy_in_token_subspace'):.2f} "
                        f"({mean('random_energy'):.2f}) | {mean('angles_median_deg'):.0f} "
                        f"({mean('random_angles_median_deg'):.0f}) | " + " | ".join(f"{v:.2f}" for v in [*terms, 1 - sum(terms)]) + " |")
    return head + rows if rows else ["no run of an arm that adds positions passed the gate"]


def order(scores: dict[str, float]) -> str:
    """Names best first, ties joined by '='."""
    by_rank = sorted(ranks(scores).items(), key=lambda kv: kv[1])
    groups: dict[int, list[str]] = {}
    for name, rank in by_rank:
        groups.setdefault(rank, []).append(name)
    return " > ".join(" = ".join(names) for names in groups.values())


def beside_paper(runs: list[Run], tasks: list[str]) -> list[str]:
    """Per task, each of their schemes' out-of-distribution exact match here (mean over counted seeds) and theirs
    (mean of their 3 seeds; sort: their rank, its accuracies are a figure), and the order each gives."""
    lines = ["Per task, out-of-distribution exact match here / theirs (here: mean over the runs that passed the gate, "
             "with how many did where some failed; theirs: mean of 3 seeds, for sort their rank):", "",
             "| task | " + " | ".join(f"{s} ({a})" for s, a in PAPER_ARMS.items()) + " | order here | order theirs |",
             "|---|" + "---|" * (len(PAPER_ARMS) + 2)]
    for task in tasks:
        here = {s: ood_score(counted(runs, a, task)) for s, a in PAPER_ARMS.items()}
        theirs = paper_ood(task)
        sort_rank = PAPER["sort_rank"]["rank"] if task == "sort" else {}
        cells = []
        for scheme in PAPER_ARMS:
            ran = [r for r in runs if r["arm"] == PAPER_ARMS[scheme] and r["task"] == task]
            kept = sum(r["gate"] for r in ran)
            mine = "not run" if not ran else "gate failed" if here[scheme] is None else f"{here[scheme]:.2f}" + (
                f" ({kept} of {len(ran)} runs)" if kept < len(ran) else "")
            other = f"{theirs[scheme]:.2f}" if theirs else (f"rank {sort_rank[scheme]}" if sort_rank else "–")
            cells.append(f"{mine} / {other}")
        ours = order({s: -1.0 if v is None else v for s, v in here.items()}) \
            if any(v is not None for v in here.values()) else "no counted run"
        published = order(theirs) if theirs else order({s: -r for s, r in sort_rank.items()}) if sort_rank else "–"
        lines.append(f"| {task} | " + " | ".join(cells) + f" | {ours} | {published} |")
    splits = "; ".join(f"{t}: {v['split']}" for t, v in PAPER["by_task"].items()) + f"; sort: {PAPER['sort_rank']['split']}"
    return lines + ["", f"Their splits: {splits}. Here: train lengths as in the settings, the digits as symbols."]


def ordered(runs: list[Run], settings: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The arms and tasks that ran, in the settings' order (arms.py's, settings.py's)."""
    return ([a for a in settings["arms"] if any(r["arm"] == a for r in runs)],
            [t for t in settings["tasks"] if any(r["task"] == t for r in runs)])


def every_arm(runs: list[Run], arms: list[str], tasks: list[str], settings: dict[str, Any]) -> list[str]:
    """Two rankings of the arms: the first tier over its seeds, and every arm over the seeds every arm ran (the
    second tier runs fewer), each over its (task, seed) columns."""
    first = [a for a in arms if settings["arms"][a]["tier"] == 1]
    first_seeds = sorted({r["seed"] for r in runs if r["arm"] in first})
    shared = sorted(set.intersection(*({r["seed"] for r in runs if r["arm"] == a} for a in arms)))
    rankings = [(f"first tier, seeds {', '.join(map(str, first_seeds))}", *ranking_table(runs, first, tasks, first_seeds)),
                (f"every arm, seed{'s' if len(shared) > 1 else ''} {', '.join(map(str, shared)) or 'none shared'}",
                 *ranking_table(runs, arms, tasks, shared))]
    if not any(ranked for _, ranked, _ in rankings):
        return ["no task has a counted run: no ranking"]
    lines = ["| arm | " + " | ".join(f"MRR, {name} ({len(cols)} columns)" for name, _, cols in rankings) + " |",
             "|---|" + "---|" * len(rankings)]
    lines += [f"| {arm} | " + " | ".join(f"{ranked[arm]:.2f}" if arm in ranked else "–" for _, ranked, _ in rankings)
              + " |" for arm in sorted(arms, key=lambda a: [-r.get(a, -1) for _, r, _ in rankings[::-1]])]
    return lines


def summary(runs: list[Run], settings: dict[str, Any]) -> str:
    arms, tasks = ordered(runs, settings)
    lines = [f"Exact match of tiny decoders trained on input lengths {min(settings['train_lengths'])}–"
             f"{max(settings['train_lengths'])} and scored on {min(settings['test_lengths'])}–"
             f"{max(settings['test_lengths'])}; a run counts only at ≥ {settings['gate']:.0%} in distribution.", "",
             "### Headline: the paper's five schemes, what neither the gate nor the seed decides", "",
             *headline(runs, tasks), ""]
    for task in tasks:
        lines += task_table(runs, arms, task) + [""]
    failed = [r for r in runs if not r["gate"]]
    lines += ["### Runs that failed the in-distribution gate", ""]
    lines += [f"- {r['arm']} / {r['task']} / seed {r['seed']}: {r['iid']['exact_match']:.3f} in distribution"
              for r in failed] or ["none"]
    ours, ranked, splits = paper_ranking(runs, arms, tasks)
    if not ranked:
        lines += ["", "### MRR over the paper's five schemes", "", "no counted run of theirs "
                  f"({', '.join(ours) or 'none of their arms ran'}): no ranking"]
    else:
        # where every run of theirs passed the gate, the ranking is of extrapolation alone (theirs all fit, ~100%)
        fitted = [t for t in tasks if all(r["gate"] for r in runs if r["task"] == t and r["arm"] in ours)]
        _, alone, alone_cols = paper_ranking(runs, arms, fitted)
        lines += ["", f"### MRR over the paper's five schemes ({len(splits)} columns of task × seed with a counted "
                      f"run here; theirs: 17 task splits × 3 seeds)", "",
                  "| scheme | arm | MRR here | MRR here, on the tasks every run of their schemes fits "
                  f"({', '.join(fitted) or 'none'}: {len(alone_cols)} columns) | MRR (Kazemnejad et al.) |",
                  "|---|---|---|---|---|"]
        lines += [f"| {theirs} | {arm} | {ranked[arm]:.2f} | {f'{alone[arm]:.2f}' if alone else '–'} | "
                  f"{PAPER['mrr_ood'][theirs]:.2f} |" for theirs, arm in PAPER_ARMS.items() if arm in ranked]
        lines += ["", *beside_paper(runs, tasks)]
    lines += ["", "### MRR over every arm", "", *every_arm(runs, arms, tasks, settings)]
    lines += ["", "### Added positions in models that learned: the token/position geometry and layer 0's four terms",
              "", *geometry_table(runs, arms, tasks)]
    lines += ["", f"The paper's numbers: {PAPER['source']}."]
    return "\n".join(lines) + "\n"


def draw(runs: list[Run], settings: dict[str, Any], out: Path) -> None:
    """One panel per task: pooled out-of-distribution exact match by length per arm, shaded 95% intervals."""
    arms, tasks = ordered(runs, settings)
    plt = plots.pyplot()
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for i, arm in enumerate(arms):
            curve = pooled_curve(counted(runs, arm, task))
            if curve:
                xs = list(curve)
                ax.plot(xs, [curve[n][0] for n in xs], marker="o", ms=2, color=f"C{i % 10}",
                        ls="-" if i < 10 else "--", label=arm)
                ax.fill_between(xs, [curve[n][1] for n in xs], [curve[n][2] for n in xs], color=f"C{i % 10}",
                                alpha=0.12)
        if not ax.lines:
            ax.text(0.5, 0.5, "no run passed the gate", ha="center", transform=ax.transAxes)
        ax.set(title=task, xlabel="input length (symbols)", ylabel="exact match", ylim=(-0.02, 1.02))
    if any(ax.lines for ax in axes[0]):
        axes[0][-1].legend(*next(ax for ax in axes[0][::-1] if ax.lines).get_legend_handles_labels(), fontsize=7,
                           loc="upper left", bbox_to_anchor=(1.02, 1.0))  # beside the panels: inside, it hid curves
    plots.save(fig, out / "results.png")


def draw_ranking(runs: list[Run], settings: dict[str, Any], out: Path) -> Path | None:
    """ranking.png: the paper's five schemes' MRR here beside theirs (None: no counted run of theirs)."""
    _, ranked, cols = paper_ranking(runs, *ordered(runs, settings))
    if not ranked:
        return None
    schemes = [s for s, a in PAPER_ARMS.items() if a in ranked]
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ys = range(len(schemes))
    ax.barh([y + 0.2 for y in ys], [ranked[PAPER_ARMS[s]] for s in schemes], height=0.4,
            label=f"here: tiny decoders, {len(cols)} task × seed columns")
    ax.barh([y - 0.2 for y in ys], [PAPER["mrr_ood"][s] for s in schemes], height=0.4,
            label="Kazemnejad et al. (2023): 17 splits × 3 seeds")
    ax.set(yticks=list(ys), yticklabels=[f"{s} ({PAPER_ARMS[s]})" for s in schemes], xlim=(0, 1),
           xlabel="mean reciprocal rank, out of distribution")
    ax.invert_yaxis()
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    return plots.save(fig, out / "ranking.png")
