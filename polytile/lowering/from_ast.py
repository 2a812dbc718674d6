"""The first lowering step: the polyhedral AST and statement plans become loop IR.

Each AST user node becomes the statement it stands for: a computation's store (reductions combine
with the old value), an initialization, a cache copy, or the loads that bind data-dependent bounds.
Reads redirected to caches are rewritten here, with the offsets isl computed.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import replace

from .. import dtypes
from ..errors import LoweringError
from ..lang import expr as lx
from ..lang.names import reserved_reason
from ..lang.tensor import ComputeTensor
from ..poly.astgen import Binding
from ..poly.astnodes import AExpr, AstBlock, AstFor, AstIf, AstMark, AstNode, AstUser, aint, reads_any
from ..poly.cache import CacheRewrite
from ..poly.materialize import Plan, StmtPlan
from . import loopir as ir

_AOPS = {"add": "+", "sub": "-", "mul": "*", "fdiv_q": "//", "pdiv_q": "//", "pdiv_r": "%", "zdiv_r": "%",
         "min": "min", "max": "max"}
_ACMP = {"eq": "==", "le": "<=", "lt": "<", "ge": ">=", "gt": ">"}


def aexpr(e: AExpr, env: Mapping[str, ir.Expr]) -> ir.Expr:
    """An isl integer expression in loop IR; identifiers are looked up in ``env`` (else variables)."""
    if e.op == "int":
        return ir.Const(e.value, dtypes.INDEX)
    if e.op == "id":
        return env.get(e.name, ir.Var(e.name))
    args = [aexpr(a, env) for a in e.args]
    if e.op in ("add", "mul", "min", "max"):  # isl's associative operations may have any number of operands
        return functools.reduce(lambda x, y: ir.BinOp(_AOPS[e.op], x, y), args)
    if e.op in _AOPS:
        if len(args) != 2:
            raise LoweringError(f"unexpected {len(args)}-operand integer operation {e.op}")
        return ir.BinOp(_AOPS[e.op], args[0], args[1])
    if e.op == "neg":
        return ir.BinOp("-", ir.Const(0, dtypes.INDEX), args[0])
    if e.op in _ACMP:
        return ir.Cmp(_ACMP[e.op], args[0], args[1])
    if e.op in ("and", "or"):
        return ir.Logic("&&" if e.op == "and" else "||", tuple(args))
    if e.op == "select":
        return ir.Select(args[0], args[1], args[2])
    raise LoweringError(f"unexpected integer operation {e.op}")


_REDUCE_COMBINE = {"sum": "+", "prod": "*", "max": "max", "min": "min"}


class ExprConverter:
    """Algorithm expressions to loop IR, with iterators bound to IR expressions."""

    def __init__(self, buffers: Mapping[str, ir.Buffer], rewrites: list[CacheRewrite],
                 env_dims: Mapping[str, ir.Expr], loops: Mapping[str, ir.Expr] | None = None):
        self.buffers = buffers
        self.rewrites = {r.tensor: r for r in rewrites}
        self.env_dims = env_dims
        self.loops = loops or {}

    def index_of(self, tensor: str, idx: tuple[ir.Expr, ...]) -> tuple[ir.Buffer, tuple[ir.Expr, ...]]:
        rw = self.rewrites.get(tensor)
        if rw is None:
            return self.buffers[tensor], idx
        prefix = {f"p{k}": self.loops.get(f"@d{k}", aexpr(v, self.env_dims)) for k, v in enumerate(rw.prefix)}
        rel = [ir.BinOp("-", i, aexpr(o, prefix)) for i, o in zip(idx, rw.offset)]
        env = {id(v): r for v, r in zip(rw.layout_vars, rel)}
        out = tuple(self._convert(e, env) for e in rw.layout_exprs)
        return self.buffers[rw.cache], out

    def convert(self, e: lx.Expr, env: Mapping[int, ir.Expr]) -> ir.Expr:
        return self._convert(e, env)

    def _convert(self, e: lx.Expr, env: Mapping[int, ir.Expr]) -> ir.Expr:
        c = self._convert
        if isinstance(e, lx.Const):
            return ir.Const(e.value, e.dtype)
        if isinstance(e, lx.Param):
            return ir.Var(e.name)
        if isinstance(e, lx.Var):
            if id(e) in env:
                return env[id(e)]
            raise LoweringError(f"iterator {e.name} is not bound here")
        if isinstance(e, lx.BinOp):
            return ir.BinOp(e.op, c(e.a, env), c(e.b, env))
        if isinstance(e, lx.Cmp):
            return ir.Cmp(e.op, c(e.a, env), c(e.b, env))
        if isinstance(e, lx.Logic):
            return ir.Logic(e.op, (c(e.a, env), c(e.b, env)))
        if isinstance(e, lx.Not):
            return ir.Logic("!", (c(e.a, env),))
        if isinstance(e, lx.Select):
            return ir.Select(c(e.cond, env), c(e.a, env), c(e.b, env))
        if isinstance(e, lx.Cast):
            return ir.Cast(e.dtype, c(e.a, env))
        if isinstance(e, lx.Call):
            if e.name in ("max", "min"):
                return ir.BinOp(e.name, c(e.args[0], env), c(e.args[1], env))
            return ir.Call(e.name, tuple(c(a, env) for a in e.args), e.dtype)
        if isinstance(e, lx.Load):
            idx = tuple(c(i, env) for i in e.indices)
            buf, idx = self.index_of(e.tensor.name, idx)
            return ir.Load(buf, idx)
        if isinstance(e, lx.Reduce):
            raise LoweringError("a reduction nested in an expression reached lowering")
        raise LoweringError(f"cannot lower {type(e).__name__}")


def shape_expr(e: lx.Expr) -> ir.Expr:
    from .pipeline import shape_expr as convert
    return convert(e)


class IRBuilder:
    """Builds the loop IR of a plan; ``buffers`` holds every tensor and cache buffer by name."""

    def __init__(self, plan: Plan, computations: Mapping[str, ComputeTensor], bodies: Mapping[str, lx.Expr],
                 buffers: Mapping[str, ir.Buffer], tags: Mapping[str, Mapping[str, str]],
                 dyn_exprs: Mapping[str, lx.Expr], reserved: set[str],
                 virtual: Mapping[str, tuple[ComputeTensor, lx.Expr]] | None = None):
        self.plan = plan
        self.virtual = virtual or {}  # computations inlined into their caches' copies
        self.computations = computations
        self.bodies = bodies
        self.buffers = buffers
        self.tags = tags
        self.dyn_exprs = dyn_exprs
        self.bindings = {b.name: b for b in plan.bindings}
        self.reserved = reserved
        self.cache_levels = {c.name: c for c in plan.caches}
        self.opened: set[str] = set()  # buffers whose scope encloses the nodes being built
        # by node id; each entry keeps its node alive, so that the id of a node built while lowering
        # (leading_binding's) is not reused by another
        self._marks: dict[tuple[int, str, bool], tuple[AstNode, set[str]]] = {}

    def build(self) -> ir.Stmt:
        return self.node(self.plan.ast, {}, [])

    # --- nodes ------------------------------------------------------------------------------------
    def node(self, n: AstNode, env: dict[str, ir.Expr], scope: list[str]) -> ir.Stmt:
        if isinstance(n, AstBlock):
            return self.block(list(n.body), env, scope)
        if isinstance(n, AstFor):
            return self.loop(n, env, scope)
        if isinstance(n, AstIf):
            if self.bindings and self.leading_binding(n) is not None:  # its loads go before the if (block)
                return self.block([n], env, scope)
            then = self.node(n.then, env, scope)
            orelse = self.node(n.orelse, env, scope) if n.orelse is not None else None
            return ir.If(aexpr(n.cond, env), then, orelse)
        if isinstance(n, AstUser):
            if n.stmt in self.bindings:  # no statement after it needs the bounds
                return ir.Block(())
            plan = self.plan.statements[n.stmt]
            if plan.kind in ("alloc", "free"):  # the scope is opened around its statements (block)
                if plan.owner not in self.opened:
                    raise LoweringError(f"the scope of cache {plan.owner} is split by the AST generator")
                return ir.Block(())
            return self.user(n, env)
        if isinstance(n, AstMark):
            return self.node(n.body, env, scope)
        raise LoweringError(f"unexpected AST node {type(n).__name__}")

    def block(self, nodes: list[AstNode], env: dict[str, ir.Expr], scope: list[str]) -> ir.Stmt:
        # isl nests blocks without meaning; bindings scope over siblings
        nodes = self.rejoin_scopes(_flatten_blocks(nodes))
        out: list[ir.Stmt] = []
        k = 0
        while k < len(nodes):
            n = nodes[k]
            binding = self.leading_binding(n)
            if binding is not None:
                user, conds, after = binding
                rest = self.block(([after] if after is not None else []) + nodes[k + 1:], env, scope)
                out.append(self.bind(self.bindings[user.stmt], user, conds, env, rest))
                break
            starts = self._scope_marks(n, "alloc") - self.opened
            if starts:
                end, owners = self._scope_end(nodes, k, starts)
                self.opened |= owners
                inner = self.block(nodes[k:end + 1], env, scope)
                self.opened -= owners
                for owner in sorted(owners):
                    inner = ir.Allocate(self.buffers[owner], inner)
                out.append(inner)
                k = end + 1
                continue
            out.append(self.node(n, env, scope))
            k += 1
        return ir.block(out)

    def rejoin_scopes(self, nodes: list[AstNode]) -> list[AstNode]:
        """``nodes`` with each run of sibling loops that isl split a cache's scope over (the allocation
        in one loop, the release in a later one) made one loop again.

        With atomic loops, isl scans each statement in a loop of its own where the loop's dimension
        has one value per outer iteration that it cannot write as one expression (``c9 = 0`` where
        ``c7 <= 1``, ``c9 = 2`` where ``c7 >= 2``: a where= that cuts a reduction's range, fuzz seed
        101 case 2449). Sibling loops of one dimension and the same bounds run in schedule order
        when fused: their instances of one iteration in the siblings' order, which is the schedule's
        wherever isl may order them so, and those of different iterations in the order of the loop.
        Grid and block dimensions are left apart (their siblings may need a barrier between them)."""
        out: list[AstNode] = []
        k = 0
        while k < len(nodes):
            first = _as_loop(nodes[k])
            if first is not None and self._unreleased([first]):
                run = [first]
                while self._unreleased(run) and k + len(run) < len(nodes):
                    nxt = _as_loop(nodes[k + len(run)])
                    if nxt is None or _loop_header(nxt) != _loop_header(first):
                        break
                    run.append(nxt)
                fused = replace(first, body=AstBlock(tuple(loop.body for loop in run)))
                if not self._unreleased(run) and not _bound(self.loop_kind(fused, _users(fused.body))):
                    out.append(fused)
                    k += len(run)
                    continue
            out.append(nodes[k])
            k += 1
        return out

    def _unreleased(self, loops: list[AstFor]) -> set[str]:
        """The buffers allocated in ``loops`` and released in none of them (whose scopes are not open)."""
        allocated = set().union(*(self._scope_marks(loop.body, "alloc", deep=True) for loop in loops))
        released = set().union(*(self._scope_marks(loop.body, "free", deep=True) for loop in loops))
        return allocated - released - self.opened

    def _scope_marks(self, n: AstNode, kind: str, deep: bool = False) -> set[str]:
        """The buffers whose allocation (``kind`` "alloc") or release statement ``n`` holds outside any
        loop (``deep``: inside loops too). In one execution of a block, the statements outside loops
        belong to one iteration of the buffers' loops; so do those in a loop of one iteration that is
        no grid or block dimension (isl's degenerate loop, a value bound once: ``c3 = max(0, -c1)``
        around a cache's allocation, fuzz seed 101 case 8070)."""
        key = (id(n), kind, deep)
        if key not in self._marks:
            out: set[str] = set()
            stack = [n]
            while stack:
                x = stack.pop()
                if isinstance(x, AstUser):
                    plan = self.plan.statements.get(x.stmt)
                    if plan is not None and plan.kind == kind:
                        out.add(plan.owner)
                elif isinstance(x, AstBlock):
                    stack.extend(x.body)
                elif isinstance(x, AstIf):
                    stack += [x.then] + ([x.orelse] if x.orelse is not None else [])
                elif isinstance(x, AstMark) or (isinstance(x, AstFor) and (deep or self.runs_once(x))):
                    stack.append(x.body)
            self._marks[key] = (n, out)
        return self._marks[key][1]

    def _scope_end(self, nodes: list[AstNode], k: int, starts: set[str]) -> tuple[int, frozenset[str]]:
        """The scope of the buffers allocated in ``nodes[k]``: up to the last node holding a release
        before the next allocation of the same buffer. isl may guard the allocation and the release
        of one iteration in different branches (a peeled first iteration), or put the release in a
        loop of an inner level that runs the buffer's users in one of its iterations only; the scope
        then spans that loop. It is extended over the scopes of buffers allocated inside that end
        further out (isl may order two releases of one slot either way; a longer scope is harmless).
        Returns the index of the last node and the buffers scoped."""
        def last_release(owner: str, start: int) -> int:
            last = -1
            for j in range(start, len(nodes)):
                if j > start and owner in self._scope_marks(nodes[j], "alloc", deep=True):
                    break
                if owner in self._scope_marks(nodes[j], "free", deep=True):
                    last = j
            if last < 0:
                raise LoweringError(f"the scope of cache {owner} is split by the AST generator")
            return last

        owners = set(starts)
        end = max(last_release(o, k) for o in owners)
        j = k + 1
        while j <= end:
            for inner in sorted(self._scope_marks(nodes[j], "alloc") - owners - self.opened):
                inner_end = last_release(inner, j)
                if inner_end > end:
                    end = inner_end
                    owners.add(inner)
            j += 1
        return end, frozenset(owners)

    def leading_binding(self, n: AstNode) -> tuple[AstUser, list[AExpr], AstNode | None] | None:
        """The binding statement that ``n`` runs first, if any: ``n`` itself or, nested, in a branch of
        an ``if``; with the conditions around it and what ``n`` runs besides it (under the same
        conditions). Its loads scope over all that follows. isl may run other statements of the
        branch before the binding (its computation's initialization, guarded alike) and the binding's
        users after the branch: the loads move before those statements, unless one writes an array
        they read (then they scope over the rest of the branch only). isl may also put the binding in
        the ``else`` of a statement whose instances are disjoint from its (``if (c1 >= 2) T(...);
        else _bind0(...)``, then the users): the loads, guarded by the branch's condition, move before
        the ``if``; the other branch runs only where they are not needed (they read 0 there)."""
        if isinstance(n, AstUser) and n.stmt in self.bindings:
            return n, [], None
        if not isinstance(n, AstIf):
            return None
        branches = [(n.then, n.cond)] + ([(n.orelse, _negated(n.cond))] if n.orelse is not None else [])
        for k, (branch, cond) in enumerate(branches):
            body = _flatten_blocks([branch])
            found = next(((j, b) for j, x in enumerate(body) if (b := self.leading_binding(x)) is not None), None)
            if found is None:
                continue
            j, (user, conds, after) = found
            if j and self._writes_bounds(self.bindings[user.stmt], body[:j]):
                return None
            rest = body[:j] + ([after] if after is not None else []) + body[j + 1:]
            if n.orelse is None:
                return user, [cond, *conds], AstIf(n.cond, AstBlock(tuple(rest)), None) if rest else None
            left = AstBlock(tuple(rest))
            return user, [cond, *conds], AstIf(n.cond, left, n.orelse) if k == 0 else AstIf(n.cond, n.then, left)
        return None

    def _writes_bounds(self, b: Binding, nodes: list[AstNode]) -> bool:
        """Whether a statement of ``nodes`` writes an array that the loads of ``b`` read."""
        read = {x.tensor.name for p in b.params for x in lx.walk(self.dyn_exprs[p]) if isinstance(x, lx.Load)}
        stmts = _users(AstBlock(tuple(nodes)))
        return any(read & {w.tensor for w in it.stmt.writes} for it in self.plan.items if it.stmt.name in stmts)

    def bind(self, b: Binding, n: AstUser, conds: list[AExpr], env: dict[str, ir.Expr], body: ir.Stmt) -> ir.Stmt:
        """``body`` inside the loads of ``b``'s bounds; where isl guards the binding by ``conds``, the
        loads are guarded too (elsewhere the computation has no instance and nothing reads them)."""
        comp = self.computations[b.owner]
        args = [aexpr(a, env) for a in n.args]
        src_vals = dict(zip(b.sources, args[b.prefix_len:]))
        axes = {a.name: a for a in (*comp.axes, *comp.reduce_axes)}
        conv = ExprConverter(self.buffers, [], {})
        var_env = {id(axes[name]): v for name, v in src_vals.items()}
        # isl may guard the binding by a condition on the bounds themselves (a test hoisted above it
        # that its users share, e.g. _d1 + c1 - 3 * ((2 * c1 + c3 + 7) / 6) + 3 >= _d0); such a
        # condition cannot guard their loads, which then read clamped indices: past the prefixes the
        # other conditions keep, no value of the bounds gives the computation an instance
        own = set(b.params)
        guards = [aexpr(c, env) for c in conds if not reads_any(c, own)]
        clamp = len(guards) < len(conds)
        out = body
        for p in reversed(b.params):
            value: ir.Expr = ir.Cast(dtypes.INDEX, conv.convert(self.dyn_exprs[p], var_env))
            if clamp:
                value = _ClampedLoads().expr(value)
            if guards:
                value = ir.Select(guards[0] if len(guards) == 1 else ir.Logic("&&", tuple(guards)), value,
                                  ir.const(0))
            out = ir.LetStmt(ir.Var(p), value, out)
        return out

    def loop(self, n: AstFor, env: dict[str, ir.Expr], scope: list[str]) -> ir.Stmt:
        lo = aexpr(n.init, env)
        users = _users(n.body)
        name = self.loop_name(n, users, scope)
        kind = self.loop_kind(n, users)
        if n.degenerate and not _bound(kind):
            env2 = dict(env)
            env2[n.iterator] = lo
            return self.node(n.body, env2, scope)
        if n.degenerate:  # a bound loop of one iteration is still a grid or block dimension
            var = ir.Var(name)
            env2 = dict(env, **{n.iterator: var, f"@d{n.dim}": var})
            body = self.node(n.body, env2, scope + [name])
            return ir.For(var, lo, ir.const(1), body, kind, n.dim, self.gpu_bounds(n, kind, users, env))
        cond = n.cond
        if cond.op not in ("le", "lt") or cond.args[0] != AExpr("id", name=n.iterator):
            raise LoweringError(f"unexpected loop condition {cond}")
        hi = aexpr(cond.args[1], env)
        extent = ir.BinOp("-", hi, lo) if cond.op == "lt" else ir.BinOp("+", ir.BinOp("-", hi, lo), ir.const(1))
        var = ir.Var(name)
        env2 = dict(env)
        if n.step == 1:
            env2[n.iterator] = var
            env2[f"@d{n.dim}"] = var
            body = self.node(n.body, env2, scope + [name])
            loop = ir.For(var, lo, extent, body, kind, n.dim, self.gpu_bounds(n, kind, users, env))
        else:
            env2[n.iterator] = ir.BinOp("+", lo, ir.BinOp("*", var, ir.const(n.step)))
            body = self.node(n.body, env2, scope + [name])
            trips = ir.BinOp("//", ir.BinOp("+", extent, ir.const(n.step - 1)), ir.const(n.step))
            if _bound(kind):
                raise LoweringError(f"loop {name} is bound to {kind} but steps by {n.step}; bind a loop of step 1")
            loop = ir.For(var, ir.const(0), trips, body, kind, n.dim)
        return loop

    def gpu_bounds(self, n: AstFor, kind: str, users: set[str], env: dict[str, ir.Expr]
                   ) -> tuple[ir.Expr, ir.Expr] | None:
        if not _bound(kind):
            return None
        lo, hi = self.plan.dim_range(n.dim, users, constant=kind.startswith("threadIdx"))
        return aexpr(lo, env), aexpr(hi, env)

    def runs_once(self, n: AstFor) -> bool:
        """Whether loop ``n`` is only a value bound for its body (one iteration, no grid or block
        dimension): it becomes no loop."""
        return n.degenerate and not _bound(self.loop_kind(n, _users(n.body)))

    def loop_name(self, n: AstFor, users: set[str], scope: list[str]) -> str:
        names = {self.plan.statements[u].loop_names.get(n.dim) for u in users if u in self.plan.statements}
        names.discard(None)
        if len(names) == 1:
            name = names.pop().replace(".", "_")  # type: ignore[union-attr]
            if self.usable(name, scope):
                return name
        name = n.iterator
        while not self.usable(name, scope):
            name += "_"
        return name

    def usable(self, name: str, scope: list[str]) -> bool:
        """Whether a loop variable can be called ``name`` in generated code (not a C++ keyword or a
        reserved name, not an enclosing loop's, a tensor's or a parameter's)."""
        return name not in scope and name not in self.reserved and reserved_reason(name) is None

    def loop_kind(self, n: AstFor, users: set[str]) -> str:
        copies = [self.plan.statements[u] for u in users
                  if u in self.plan.statements and self.plan.statements[u].kind in ("copy_in", "copy_out", "fill")]
        if copies and len(copies) == len([u for u in users if u in self.plan.statements]):
            return self.copy_loop_kind(n, copies)
        kinds = set()
        for u in users:
            plan = self.plan.statements.get(u)
            if plan is None:
                continue
            loop = plan.loop_names.get(n.dim)
            if loop is None:
                continue
            tag = self.tags.get(plan.owner, {}).get(loop)
            if tag is not None and plan.kind in ("compute", "init"):
                kinds.add(tag)
        if len(kinds) > 1:
            raise LoweringError(f"loop {n.iterator} is tagged both {' and '.join(sorted(kinds))} by the "
                                "computations it holds")
        return kinds.pop() if kinds else "serial"

    def copy_loop_kind(self, n: AstFor, copies: list[StmtPlan]) -> str:
        """Cache copies: the innermost loop is vectorized; register tiles (write caches and caches
        placed in "local" memory, small enough) are copied with every loop unrolled, so that
        promotion to registers can apply."""
        innermost = all(n.dim == max(p.loop_names) for p in copies)
        if innermost:
            return "vectorize"
        caches = [self.cache_levels[p.owner] for p in copies]
        registers = all((c.kind == "write" or c.loc == "local")
                        and _const_bytes(self.buffers[c.name]) <= REGISTER_CACHE_BYTES for c in caches)
        return "unroll" if registers else "serial"

    # --- statements -----------------------------------------------------------------------------
    def user(self, n: AstUser, env: dict[str, ir.Expr]) -> ir.Stmt:
        plan = self.plan.statements[n.stmt]
        args = [aexpr(a, env) for a in n.args]
        dims_env = dict(zip(plan.dims, args))
        conv = ExprConverter(self.buffers, plan.rewrites, dims_env, env)
        if plan.kind in ("copy_in", "copy_out", "fill"):
            return self.copy(plan, conv, dims_env, env)
        comp = self.computations[plan.owner]
        axes = list(comp.axes) + (list(comp.reduce_axes) if plan.kind == "compute" else [])
        var_env = {id(a): v for a, v in zip(axes, args)}
        data_idx = tuple(var_env[id(a)] for a in comp.axes)
        buf, idx = conv.index_of(comp.name, data_idx)
        red = comp.reduction
        guard: lx.Expr | None = None
        if plan.kind == "init":  # where= holds for the initialization too: elsewhere nothing is written
            assert red is not None
            value = ir.Const(red.identity().value, buf.dtype)
            guard = comp.where
        else:
            body = self.bodies[comp.name]
            if red is not None:
                assert isinstance(body, lx.Reduce)
                term = conv.convert(body.body, var_env)
                op = _REDUCE_COMBINE[red.op]
                value = _converted(buf.dtype, ir.BinOp(op, _converted(term.dtype, ir.Load(buf, idx)), term))
                guard = body.where  # (with the inlined producers, unlike red.where)
            else:
                value = conv.convert(body, var_env)
            if comp.where is not None:
                guard = comp.where if guard is None else (guard & comp.where)
        store: ir.Stmt = ir.Store(buf, idx, value)
        if guard is not None:
            # affine parts are already in the domain; evaluating them again is harmless and simple
            store = ir.If(conv.convert(guard, var_env), store)
        return store

    def copy(self, plan: StmtPlan, conv: ExprConverter, dims_env: Mapping[str, ir.Expr],
             env: dict[str, ir.Expr]) -> ir.Stmt:
        cache = self.cache_levels[plan.owner]
        tensor = cache.tensor
        elem = tuple(aexpr(e, dims_env) for e in plan.elem_index)
        if plan.cache_rewrite is not None:
            cbuf, cidx = ExprConverter(self.buffers, [plan.cache_rewrite], dims_env, env).index_of(tensor, elem)
        else:
            cbuf, cidx = self.buffers[cache.name], tuple(aexpr(e, dims_env) for e in plan.cache_index)
        if plan.kind == "fill":
            return ir.Store(cbuf, cidx, ir.Const(plan.fill_value, cbuf.dtype))  # type: ignore[arg-type]
        if plan.kind == "copy_in":
            value: ir.Expr
            if tensor in self.virtual and tensor not in conv.rewrites:
                # computed while copying (inlined into the cache); a cache chained inside another
                # one of the same tensor (shared, then registers) copies from that one instead
                comp, body = self.virtual[tensor]
                value = conv.convert(body, {id(a): i for a, i in zip(comp.axes, elem)})
                if value.dtype != comp.dtype:
                    value = ir.Cast(comp.dtype, value)
                shape = tuple(shape_expr(d) for d in comp.shape)
                sidx = elem
            else:
                sbuf, sidx = conv.index_of(tensor, elem)  # the tensor, or the previous cache of a chain
                value, shape = ir.Load(sbuf, sidx), sbuf.shape
            if plan.zfill:  # a whole tile: the elements past the tensor's end are zeros
                inside = [ir.Cmp("<", i, d) for i, d in zip(sidx, shape)]
                value = _zero_unless(inside, value)
            return ir.Store(cbuf, cidx, value)
        tbuf = self.buffers[tensor]
        dbuf, didx = conv.index_of(tensor, elem)  # the tensor, or the next buffer out of a chain
        done: ir.Expr = ir.Load(cbuf, cidx)
        comp = self.computations.get(tensor)
        if comp is not None and comp.epilogue is not None and dbuf is tbuf:
            # the complete sums, where they leave for the tensor itself: through the epilogue
            env = {id(a): i for a, i in zip(comp.axes, elem)}
            env[id(comp.accumulated)] = _converted(comp.value_dtype, done)
            done = conv.convert(comp.epilogue, env)
        out: ir.Stmt = ir.Store(dbuf, didx, _converted(dbuf.dtype, done))  # sums rounded once
        if plan.guard_inside:  # a whole tile written back: the elements inside the tensor
            inside = [ir.Cmp("<", i, d) for i, d in zip(elem, tbuf.shape)]
            out = ir.If(inside[0] if len(inside) == 1 else ir.Logic("&&", tuple(inside)), out)
        return out


def _converted(dtype: dtypes.DType, value: ir.Expr) -> ir.Expr:
    """``value`` in ``dtype``: the sums of a reduction stored narrower (``compute(store_dtype=)``)
    are rounded to the stored type, and read back widened to the summation type."""
    return value if value.dtype == dtype else ir.Cast(dtype, value)


def _zero_unless(conds: list[ir.Expr], value: ir.Expr) -> ir.Expr:
    """``select(all conds, value, 0)``, merged with a select-with-zero inside ``value`` (zero padding
    of an inlined producer), so that a copy stays ``select(inside, load, 0)``."""
    zero = ir.Const(0.0 if value.dtype.is_float else 0, value.dtype)
    inner = value
    while isinstance(inner, ir.Select) and isinstance(inner.b, ir.Const) and inner.b.value == 0:
        conds = [*conds, inner.cond]
        inner = inner.a
    return ir.Select(conds[0] if len(conds) == 1 else ir.Logic("&&", tuple(conds)), inner, zero)


REGISTER_CACHE_BYTES = 2048
"""Register tiles up to this size have their copy loops unrolled (a vector register file holds 2 KB)."""


def _const_bytes(b: ir.Buffer) -> int:
    n = b.dtype.itemsize
    for d in b.shape:
        if not isinstance(d, ir.Const):
            return 1 << 62
        n *= int(d.value)
    return n


class _ClampedLoads(ir.Mutator):
    """Every load's indices clamped into its buffer's dimensions."""

    def visit_Load(self, e: ir.Load) -> ir.Expr:
        idx = tuple(ir.BinOp("min", ir.BinOp("max", self.expr(i), ir.const(0)), ir.BinOp("-", n, ir.const(1)))
                    for i, n in zip(e.index, e.buffer.shape))
        return ir.Load(e.buffer, idx)


def _negated(cond: AExpr) -> AExpr:
    """The condition that holds where ``cond`` does not."""
    return AExpr("eq", (AExpr("select", (cond, aint(1), aint(0))), aint(0)))


def _flatten_blocks(nodes: list[AstNode]) -> list[AstNode]:
    """Splice nested blocks; a scope statement (allocation, release) that isl guarded alone by a
    condition is taken out of it: allocating where nothing is copied is harmless, and the scope
    must enclose its users, which isl may place in a sibling."""
    out: list[AstNode] = []
    for n in nodes:
        scope = _guarded_scope_statement(n)
        if isinstance(n, AstBlock):
            out.extend(_flatten_blocks(list(n.body)))
        elif scope is not None:
            out.append(scope)
        else:
            out.append(n)
    return out


def _guarded_scope_statement(n: AstNode) -> AstUser | None:
    """The allocation or release that ``n`` is, alone under (nested) conditions without else."""
    while isinstance(n, AstIf) and n.orelse is None:
        n = n.then
        while isinstance(n, AstBlock) and len(n.body) == 1:
            n = n.body[0]
    if isinstance(n, AstUser) and n.stmt.endswith(("__alloc", "__free")):
        return n
    return None


def _as_loop(n: AstNode) -> AstFor | None:
    """``n`` as a loop, if it is one or a loop under conditions on the outer loops alone (the
    conditions then move into the loop's body)."""
    if isinstance(n, AstFor):
        return n
    if isinstance(n, AstIf) and n.orelse is None:
        loop = _as_loop(n.then)
        if loop is not None:
            return replace(loop, body=AstIf(n.cond, loop.body, None))
    return None


def _loop_header(n: AstFor) -> tuple[object, ...]:
    return (n.dim, n.iterator, n.init, n.cond, n.step, n.degenerate)


def _bound(kind: str) -> bool:
    """Whether a loop of this kind runs along a grid or block dimension."""
    return kind.startswith(("blockIdx", "threadIdx"))


def _users(n: AstNode) -> set[str]:
    out: set[str] = set()
    stack = [n]
    while stack:
        x = stack.pop()
        if isinstance(x, AstUser):
            out.add(x.stmt)
        elif isinstance(x, AstBlock):
            stack.extend(x.body)
        elif isinstance(x, AstFor):
            stack.append(x.body)
        elif isinstance(x, AstIf):
            stack.append(x.then)
            if x.orelse is not None:
                stack.append(x.orelse)
        elif isinstance(x, AstMark):
            stack.append(x.body)
    return out
