# mentis-executor's helpers, run silently once in every kernel it starts (see kernel.rs).
#
# They live on the shell object (get_ipython()._mentis), not in the user namespace, so they survive %reset
# and never show up as user variables. Everything is imported inside the functions for the same reason.


def _mentis_install(ip):
    import itertools
    import json
    import math
    import re
    import sys
    import types

    # Plain tracebacks: the control plane and agents read them as text, not in a colour terminal.
    for scheme in ("NoColor", "nocolor"):
        try:
            ip.run_line_magic("colors", scheme)
            break
        except Exception:
            pass

    # --- rollback of a failed cell's new names -------------------------------------------------------------
    # pre_run_cell snapshots the namespace's names before each user cell; silent executions (ours) do not
    # trigger it. post_run_cell files the snapshot under the cell's execution count, so a rollback can check
    # it is undoing the cell it was asked to undo and never a stale snapshot of an earlier one.
    state = {"before": None, "last": (None, None)}

    def pre_run_cell(info=None):
        state["before"] = set(ip.user_ns)

    def post_run_cell(result=None):
        state["last"] = (getattr(result, "execution_count", None), state["before"])
        state["before"] = None

    ip.events.register("pre_run_cell", pre_run_cell)
    ip.events.register("post_run_cell", post_run_cell)

    # IPython's own bookkeeping names (_, __, ___, _i, _ii, _iii, _iN, _N, _oh, ...): never removed.
    ipython_names = re.compile(r"^(_+|_i+|_i?\d+|_oh|_ih|_dh|In|Out)$")

    def rollback(execution_count):
        """Removes the names cell `execution_count` created. Rebinding a name that existed before the cell
        is not undone: its old value is gone (keeping copies of every value would cost too much)."""
        count, before = state["last"]
        if count != execution_count or before is None:
            return []
        removed = []
        for name in list(ip.user_ns):
            if name not in before and not ipython_names.match(name):
                del ip.user_ns[name]
                removed.append(name)
        state["last"] = (None, None)
        return removed

    # --- variable summaries ---------------------------------------------------------------------------------
    STR_MAX = 1000
    ITEMS = 100
    ROWS = 10
    VAR_BUDGET = 256 * 1024
    TOTAL_BUDGET = 2 * 1024 * 1024

    def cut(s, limit):
        return s if len(s) <= limit else s[:limit] + "…"

    def safe_repr(v):
        try:
            return repr(v)
        except Exception as e:
            return "<repr failed: %s>" % type(e).__name__

    def jsonable(v, depth=0):
        """A JSON-safe, bounded copy of v: NaN/inf, numpy scalars, timestamps and the rest become strings."""
        if v is None or isinstance(v, bool):
            return v
        if isinstance(v, int):
            # Struct numbers are doubles: larger integers would silently lose digits.
            return v if -(2**53) <= v <= 2**53 else str(v)
        if isinstance(v, float):
            return v if math.isfinite(v) else str(v)
        if isinstance(v, str):
            return cut(v, STR_MAX)
        np = sys.modules.get("numpy")
        if np is not None and isinstance(v, np.generic):
            try:
                item = v.item()
            except Exception:
                item = None
            if item is not None and not isinstance(item, np.generic) and item is not v:
                return jsonable(item, depth)
        if depth < 2:
            if isinstance(v, dict):
                return {
                    cut(str(k), 200): jsonable(x, depth + 1)
                    for k, x in itertools.islice(v.items(), ITEMS)
                }
            if isinstance(v, (list, tuple, set, frozenset)):
                return [jsonable(x, depth + 1) for x in itertools.islice(v, ITEMS)]
        iso = getattr(v, "isoformat", None)
        if callable(iso):
            try:
                return str(iso())
            except Exception:
                pass
        return cut(safe_repr(v), 200)

    def frame_summary(df):
        head = df.head(ROWS)
        columns = list(df.columns[:ITEMS])
        rows = []
        for row in head.iloc[:, :ITEMS].itertuples(index=False, name=None):
            rows.append({str(c): jsonable(x, 1) for c, x in zip(columns, row)})
        return {
            "shape": list(df.shape),
            "columns": [jsonable(c, 1) for c in columns],
            "dtypes": {str(c): str(d) for c, d in itertools.islice(df.dtypes.items(), ITEMS)},
            "index": [jsonable(i, 1) for i in head.index],
            "head": rows,
        }

    def summarize(v):
        pd = sys.modules.get("pandas")
        np = sys.modules.get("numpy")
        if pd is not None and isinstance(v, pd.DataFrame):
            return frame_summary(v)
        if pd is not None and isinstance(v, pd.Series):
            return {
                "name": jsonable(v.name),
                "dtype": str(v.dtype),
                "length": len(v),
                "head": [jsonable(x, 1) for x in v.head(ITEMS).tolist()],
            }
        if np is not None and isinstance(v, np.ndarray):
            return {
                "shape": list(v.shape),
                "dtype": str(v.dtype),
                "head": [jsonable(x, 1) for x in v.ravel()[:ITEMS].tolist()],
            }
        if isinstance(v, dict):
            return {
                "length": len(v),
                "keys": [jsonable(k, 2) for k in itertools.islice(v, ITEMS)],
                "data": jsonable(v),
            }
        if isinstance(v, (list, tuple, set, frozenset)):
            return {"length": len(v), "head": [jsonable(x, 1) for x in itertools.islice(v, ITEMS)]}
        if isinstance(v, str):
            return {"value": cut(v, STR_MAX), "length": len(v)}
        if v is None or isinstance(v, (bool, int, float)) or (np is not None and isinstance(v, np.generic)):
            return {"value": jsonable(v)}
        return {"repr": cut(safe_repr(v), STR_MAX)}

    hidden = set(getattr(ip, "user_ns_hidden", {})) | {"In", "Out", "exit", "quit", "get_ipython"}

    def user_names():
        names = []
        for name, value in list(ip.user_ns.items()):
            if name.startswith("_") or name in hidden or isinstance(value, types.ModuleType):
                continue
            names.append(name)
        return sorted(names)

    class Answer:
        """Handed back through user_expressions: IPython puts _repr_json_ under application/json."""

        def __init__(self, value):
            self.value = value

        def _repr_json_(self):
            return self.value

        def __repr__(self):
            return "<mentis answer>"

    def inspect(names):
        ns = ip.user_ns
        out = []
        total = 0
        for name in names or user_names():
            if name not in ns:
                continue
            value = ns[name]
            kind = type(value).__name__
            if total > TOTAL_BUDGET:
                summary = {"omitted": "the response size limit was reached"}
            else:
                try:
                    summary = summarize(value)
                    size = len(json.dumps(summary, allow_nan=False))
                    if size > VAR_BUDGET:
                        summary = {"repr": cut(safe_repr(value), STR_MAX), "omitted": "summary too large"}
                except Exception as e:
                    summary = {"error": "%s: %s" % (type(e).__name__, cut(str(e), 200))}
            total += len(json.dumps(summary, default=str))
            out.append({"name": name, "type": kind, "summary": summary})
        return Answer(out)

    ip._mentis = types.SimpleNamespace(rollback=rollback, inspect=inspect, Answer=Answer)


_mentis_install(get_ipython())
del _mentis_install
