"""The multi-slot moves a CUDA assembly expert makes, built from legal one-slot moves.

- `walk`: one memory instruction taken up to n slots up or down, one legal move at a time,
  stopping where the next move is illegal.
- `far_moves`: each movable instruction walked 2, 4, 8, ... slots and as far as legal, the runs
  greedy search measures first (loads going up and stores going down before the others).
- `block_runs`: every load of a basic block issued as early as its dependences allow (each in
  turn, the topmost first), or every store as late; the software-pipelining-like reorder an expert
  tries on an unrolled loop body, in one step.

The search agents share these: greedy measures them as candidates, and the assembly game offers
walks of several lengths and the block runs as actions, so the learned agent can make in one step
what would otherwise take it a dozen measured one-slot moves.
"""

from __future__ import annotations

from polytile.sass.schedule import DOWN, UP, Move, Schedule

FAR_LIMIT = 64  # the most slots one run takes


def walk(schedule: Schedule, instruction: int, direction: int, slots: int) -> Schedule:
    """`instruction` moved up to `slots` slots in `direction`, one legal move at a time (the
    schedule itself when the first move is illegal)."""
    current = schedule
    for _ in range(slots):
        following, _ = current.check(Move(instruction, direction))
        if following is None:
            break
        current = following
    return current


def is_expert(schedule: Schedule, instruction: int, direction: int) -> bool:
    """A load going up or a store going down: the moves that hide latency."""
    memory = schedule.analysis.semantics[instruction].memory
    return memory is not None and bool(memory.reads if direction == UP else memory.writes)


def far_moves(schedule: Schedule, limit: int = FAR_LIMIT) -> list[Schedule]:
    """Each movable instruction taken 2, 4, 8, ... slots and as far as single legal moves allow,
    up and down (at most `limit` slots). Loads going up and stores going down come first, the
    farthest first; runs shorter than two slots are left to the single moves."""
    preferred, other = far_groups(schedule, limit)
    return preferred + other


def far_groups(schedule: Schedule, limit: int = FAR_LIMIT) -> tuple[list[Schedule], list[Schedule]]:
    """`far_moves` as (loads up and stores down, the rest)."""
    preferred, other = [], []
    for instruction in schedule.analysis.movable:
        for direction in (UP, DOWN):
            current, steps, stops = schedule, 0, []
            while steps < limit:
                following, _ = current.check(Move(instruction, direction))
                if following is None:
                    break
                current, steps = following, steps + 1
                if steps >= 2 and steps & (steps - 1) == 0:  # 2, 4, 8, ...
                    stops.append(current)
            if steps >= 2 and stops[-1] is not current:
                stops.append(current)
            (preferred if is_expert(schedule, instruction, direction) else other).extend(reversed(stops))
    return preferred, other


def block_run(schedule: Schedule, block: int, direction: int, limit: int = FAR_LIMIT) -> Schedule:
    """Every load of basic block `block` as early as legal (direction UP; the topmost load first),
    or every store as late as legal (DOWN; the bottommost first), each at most `limit` slots."""
    analysis = schedule.analysis
    b = analysis.blocks[block]
    members = [
        i for i in analysis.movable if analysis.block_of[i] == block and is_expert(schedule, i, direction)
    ]
    members.sort(key=lambda i: int(schedule.position[i]), reverse=direction == DOWN)
    current = schedule
    for instruction in members:
        current = walk(current, instruction, direction, min(limit, b.end - b.start))
    return current


def run_blocks(schedule: Schedule) -> list[int]:
    """The blocks holding two or more movable loads or stores: those `block_run` can reorder."""
    analysis = schedule.analysis
    counts: dict[int, int] = {}
    for i in analysis.movable:
        counts[analysis.block_of[i]] = counts.get(analysis.block_of[i], 0) + 1
    return sorted(block for block, n in counts.items() if n >= 2)


def block_runs(schedule: Schedule, limit: int = FAR_LIMIT) -> list[Schedule]:
    """For each block of `run_blocks`, its loads hoisted and its stores sunk (`block_run`), where
    that changes the schedule."""
    runs = []
    for block in run_blocks(schedule):
        for direction in (UP, DOWN):
            moved = block_run(schedule, block, direction, limit)
            if moved.key != schedule.key:
                runs.append(moved)
    return runs
