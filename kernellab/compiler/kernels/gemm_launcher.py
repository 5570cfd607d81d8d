"""The GEMM kernel's launcher as text: checks the operands' ranks, dtypes, devices and shapes, allocates the output
(and the fixups' workspace and counters, cached per device), picks the grid and launches ``<name>_kernel``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .template import stmts

if TYPE_CHECKING:
    from .gemm import GemmSpec

__all__ = ["launcher_src"]


def launcher_src(spec: GemmSpec, config: dict[str, Any], vector: bool) -> str:
    """The launcher ``launch_<name>(a, b, *extra, out=None, config=None)`` of ``gemm.gemm_kernel(spec)``'s kernel
    (``vector``: the row reduction leaves one value per row)."""
    name, r = spec.name, spec.row_reduction
    tdt = f"torch.{spec.dtype}"
    nd = 3 if spec.batched else 2
    L: list[str] = [
        f"def launch_{name}(a, b, *extra, out=None, config=None):",
        f'    """{name}: {"batched " if spec.batched else ""}GEMM a @ {"b.T" if spec.trans_b else "b"}'
        f'{" + epilogue" if stmts(spec.epilogue) else ""}{" + row " + r if r else ""}."""',
        f"    cfg = {{**{config!r}, **(config or {{}})}}",
        f"    if len(extra) != {len(spec.operands)}:",
        f'        raise TypeError(f"launch_{name}: expected {len(spec.operands)} extra operand(s) '
        f'({", ".join(op.name for op in spec.operands)}), got {{len(extra)}}")',
        "    for nm, t in (('a', a), ('b', b)):",
        f"        if not isinstance(t, torch.Tensor) or t.dim() != {nd}:",
        f'            raise ValueError(f"launch_{name}: {{nm}} must be a {nd}-D tensor, got {{getattr(t, \'shape\', type(t))}}")',
        f"        if t.dtype != {tdt}:",
        f'            raise TypeError(f"launch_{name}: {{nm}} has dtype {{t.dtype}}, expected {tdt}")',
        "    if b.device != a.device:",
        f'        raise ValueError(f"launch_{name}: a on {{a.device}} but b on {{b.device}}")',
    ]
    if spec.batched:
        L += [
            "    B = max(a.shape[0], b.shape[0])",
            "    if a.shape[0] not in (1, B) or b.shape[0] not in (1, B):",
            f'        raise ValueError(f"launch_{name}: batch sizes {{a.shape[0]}} and {{b.shape[0]}} do not broadcast")',
            "    M, K = a.shape[1], a.shape[2]",
            "    sab = a.stride(0) if a.shape[0] > 1 else 0",
            "    sbb = b.stride(0) if b.shape[0] > 1 else 0",
            "    sam, sak = a.stride(1), a.stride(2)",
        ]
        bi = (1, 2)
    else:
        L += ["    B = 1", "    M, K = a.shape", "    sab = sbb = 0", "    sam, sak = a.stride(0), a.stride(1)"]
        bi = (0, 1)
    if spec.trans_b:  # b is [N, K]: the kernel reads it through swapped strides, no copy
        L += [f"    N, Kb = b.shape[{bi[0]}], b.shape[{bi[1]}]", f"    sbk, sbn = b.stride({bi[1]}), b.stride({bi[0]})"]
    else:
        L += [f"    Kb, N = b.shape[{bi[0]}], b.shape[{bi[1]}]", f"    sbk, sbn = b.stride({bi[0]}), b.stride({bi[1]})"]
    L += [
        "    if Kb != K:",
        f'        raise ValueError(f"launch_{name}: inner dimensions differ: a {{tuple(a.shape)}}, b {{tuple(b.shape)}}'
        f'{" (b is [N, K])" if spec.trans_b else ""}")',
    ]
    oshape = ("(B, M)" if spec.batched else "(M,)") if vector else ("(B, M, N)" if spec.batched else "(M, N)")
    L += [
        f"    oshape = {oshape}",
        "    if out is None:",
        f"        out = torch.empty(oshape, device=a.device, dtype={tdt})",
        f"    elif tuple(out.shape) != oshape or out.dtype != {tdt}:",
        f'        raise ValueError(f"launch_{name}: out must be {{oshape}} {tdt}, got {{tuple(out.shape)}} {{out.dtype}}")',
    ]
    if vector:
        L.append(
            "    sob, som, son = (out.stride(0), out.stride(1), 0)" if spec.batched else "    sob, som, son = 0, out.stride(0), 0"
        )
    else:
        L.append(
            "    sob, som, son = out.stride()" if spec.batched else "    sob, (som, son) = 0, out.stride()"
        )
    # operands: broadcast to their full shape (stride 0 where broadcast), so a [N] bias serves a batched GEMM
    args, strides = [], []
    for i, op in enumerate(spec.operands):
        n = op.name
        if op.kind == "scalar":
            L += [
                f"    if isinstance(extra[{i}], torch.Tensor) and extra[{i}].numel() != 1:",
                f'        raise TypeError("launch_{name}: scalar operand {n} must be a number")',
                f"    v_{n} = float(extra[{i}])",
            ]
            args.append(f"v_{n}")
            continue
        full = {
            "row": "(B, N)" if spec.batched else "(N,)",
            "col": "(B, M)" if spec.batched else "(M,)",
            "matrix": "(B, M, N)" if spec.batched else "(M, N)",
        }[op.kind]
        L += [
            f"    t = extra[{i}]",
            "    if not isinstance(t, torch.Tensor) or t.device != a.device or not t.is_floating_point():",
            f'        raise TypeError(f"launch_{name}: operand {n} must be a floating tensor on {{a.device}}")',
        ]
        if op.kind == "row":  # accept [N], [1, N] and the keepdim form [B, 1, N]
            L += ["    if t.dim() >= 2 and t.shape[-2] == 1:", "        t = t.squeeze(-2)"]
        if op.kind == "col":  # accept [M], and the keepdim forms [M, 1], [B, M, 1]
            L += ["    if t.dim() >= 2 and t.shape[-1] == 1:", "        t = t.squeeze(-1)"]
        L += [
            "    try:",
            f"        t = torch.broadcast_to(t, {full})",
            "    except RuntimeError:",
            f'        raise ValueError(f"launch_{name}: {op.kind} operand {n} of shape {{tuple(extra[{i}].shape)}} '
            f'does not broadcast to {full}") from None',
            f"    p_{n} = t",
        ]
        if spec.batched:
            L.append(f"    s_{n} = t.stride()")
        else:
            L.append(f"    s_{n} = (0,) + t.stride()")
        args.append(f"p_{n}")
        k = {"row": 2, "col": 2, "matrix": 3}[op.kind]
        strides += [f"s_{n}[{j}]" for j in range(k)]
    L += [
        "    if B == 0 or M == 0:",
        "        return out",
        "    if N == 0:",
        f'        raise ValueError("launch_{name}: a row reduction over N = 0 columns is undefined")'
        if r is not None
        else "        return out",
        "    # tl.dot needs >= 16 in every tile dimension; smaller problems get smaller tiles",
        '    BM = max(16, min(int(cfg["BLOCK_M"]), triton.next_power_of_2(M)))',
        '    BN = max(16, min(int(cfg["BLOCK_N"]), triton.next_power_of_2(N)))',
        '    BK = max(16, min(int(cfg["BLOCK_K"]), triton.next_power_of_2(max(K, 1))))',
        '    SK = max(1, int(cfg.get("SPLIT_K", 1)))' if r is None else "    SK = 1",
        "    tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)",
        "    work = B * tiles * SK",
        "    ws, cnt = a, a  # placeholders, never read unless a fixup runs",
    ]
    one_tile = "BN >= N"
    if r is None:
        L += [
            "    if SK > 1:",
            "        ws = torch.empty(work * BM * BN, device=a.device, dtype=torch.float32)",
            "        n_cnt = B * tiles",
        ]
    else:
        L += [
            f"    if not ({one_tile}):",
            f"        ws = torch.empty({2 if r in ('softmax', 'log_softmax', 'logsumexp', 'layernorm') else 1} * B * M * triton.cdiv(N, BN), "
            "device=a.device, dtype=torch.float32)",
            "        n_cnt = B * triton.cdiv(M, BM)",
        ]
    L += [
        f"    if {'SK > 1' if r is None else f'not ({one_tile})'}:",
        "        # ticket counters: zeroed once per device, every use leaves them at zero again",
        f"        cache = launch_{name}.__dict__.setdefault('_counters', {{}})",
        "        cnt = cache.get(a.device)",
        "        if cnt is None or cnt.numel() < n_cnt:",
        "            cnt = torch.zeros(max(n_cnt, 4096), device=a.device, dtype=torch.int32)",
        "            cache[a.device] = cnt",
    ]
    if spec.persistent:
        L += [
            '    progs = int(cfg.get("NUM_PROGS", 0))',
            "    if progs <= 0:",
            "        if a.is_cuda:",
            "            progs = torch.cuda.get_device_properties(a.device).multi_processor_count",
            "        else:",
            "            progs = 3  # interpreter: a few programs so that each walks several items",
            "    grid = (min(work, progs),)",
        ]
    else:
        L.append("    grid = (work,)")
    consts = ["BLOCK_M=BM", "BLOCK_N=BN", "BLOCK_K=BK", 'GROUP_M=int(cfg["GROUP_M"])', "SPLIT_K=SK",
              "EVEN_K=(K % (BK * SK) == 0)"]
    if r is not None:
        consts.append(f"ONE_N_TILE=({one_tile})")
    if r == "layernorm":
        consts.append('EPS=float(cfg["eps"])')
    if spec.dtype == "bfloat16":
        consts.append("UPCAST_DOT=(not a.is_cuda)")  # CPU tensors only run in the interpreter
    consts += ['num_warps=int(cfg["num_warps"])', 'num_stages=int(cfg["num_stages"])']
    call_args = ["a", "b", "out", "ws", "cnt", *args, "M", "N", "K", "B",
                 "sab", "sam", "sak", "sbb", "sbk", "sbn", "sob", "som", "son", *strides, *consts]
    L.append(f"    {name}_kernel[grid](")
    L += ["        " + x + "," for x in call_args]
    L += ["    )", "    return out", ""]
    return "\n".join(L)
