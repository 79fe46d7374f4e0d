"""`attention_with_kvcache`: decode attention over a KV cache, every input checked before launch.

Modelled on FlashAttention's `flash_attn_with_kvcache`. The kernel (codegen/families/decode_sm90) is specialized
on heads, K/V heads, head dim, dtype, S_q and the masks; the cache's capacity, the batch, the lengths and the
number of splits are run-time values. A call's launcher (its kernel, argument buffer, tensor maps, workspace)
is made on the first call of a signature and found by a tuple of it afterwards, as `attention()` does.
"""

from __future__ import annotations

import ctypes
import functools
import math
import threading

from layouts import LayoutError
from layouts.dtypes import BY_TORCH_NAME

from . import api as _api
from . import build as _build
from .api import NO_BACKWARD, InputError, _current_stream, _device_arch, _require_torch, _sm_count
from .families.decode_sm90 import DecodeSpec, Plan, resolve
from .families.decode_sm90.plan import CTAS_PER_SM, HEAD_PACKS, MAX_CLUSTER_SPLITS, MAX_SPLITS, gather_by_default
from .families.fwd_sm90.abi import LOG2E
from .spec import SpecError

MAX_GRID_YZ = 65535
# Tensor maps remembered per cache operand: a model's layers share one launcher (same shapes) but each has its
# own cache tensor, at an address that stays put for the whole generation; encoding a map costs ~10 us.
MAPS_PER_CACHE = 256
MAX_LAUNCHERS = 256
_LAUNCHERS: dict = {}
# A split should stream at least this many key blocks: below it the merge's reads outweigh what the split saves.
MIN_BLOCKS_PER_SPLIT = 2
SPLIT_MIN_BLOCKS = 32  # ... and this many where most SMs already have a tile
FEW_TILES = 3          # tiles at most sms / FEW_TILES leave most SMs idle: they take a wave of splits
TWO_CTA_MAX_WAVES = 2  # dense caches run two CTAs per SM up to this many waves of one-CTA tiles (choose_ctas_per_sm)
HEAD_PACK_PIECE_BYTES = 128  # a head's row of at most this many bytes takes two heads a tile (choose_head_pack)
HEAD_PACK_IDLE_SMS = 16      # ... where the two-head tiles leave at most 1/16 of the SMs idle
# Tiles of more than a wave: two CTAs a SM only from TWO_CTA_MIN_WAVES waves, where nearly every SM holds two (below
# it the SMs holding two are the tail); up to TWO_SPLIT_MAX_WAVES, two splits a tile (their clusters run in waves);
# between, one split at one CTA a SM. Against cuDNN at D=128, 8k keys (bench/LOG.md d24), two CTAs a SM / one / two
# splits: H100 17 sequences (136 tiles on 132 SMs) 0.841x / 0.937x / 0.984x, 20: 0.926x / 1.019x / 1.066x, 24: 0.930x /
# 1.054x / 1.033x; H200 17: 0.737x / 0.882x / 0.944x, 26: 0.889x / 1.026x / 1.005x, 30: 0.977x / 1.017x / 0.994x.
TWO_SPLIT_MAX_WAVES = 1.25
TWO_CTA_MIN_WAVES = 1.85
# ... and tiles over small pages (SMALL_PAGE_ROWS) up to this many: 16-row pages at 8k keys, 21 and 22 sequences
# (1.27 and 1.33 waves), one split 0.900-0.961x cuDNN against two 0.995-1.048x on two H100 boards (bench/LOG.md d42).
SMALL_PAGE_TWO_SPLIT_MAX_WAVES = 1.4
# Pages of at most this many rows (gathered, or a TMA box a page) stream slower than a dense cache: their tiles take
# more CTAs below a wave (choose_splits; bench/LOG.md d37-d40). Measured at 16 rows; 32 and 128 read as dense (d40).
SMALL_PAGE_ROWS = 16
# Split tiles under a wave run one consumer a CTA (two CTAs a SM's layout) where their CTAs are at least this share of
# the SMs (choose_ctas_per_sm): B=6's 96 CTAs on 132 SMs (0.73) gained 7%, B=1's 64 (0.48) lost 3.4% (d26).
SPLIT_TWO_CTA_MIN_FILL = 0.7
# Dense tiles over half a wave and up to this share of one take two splits where two CTAs a SM fit (choose_splits):
# one CTA a tile ran 0.80-0.96x cuDNN there on an H100 (B=9 x 8k 0.80x where B=8's 64 tiles ran 1.06x), two splits at
# two CTAs a SM 0.93-1.01x; at 120 tiles and more (B=15, 16) they tie or lose 1-3% (bench/LOG.md d41).
DENSE_TWO_SPLIT_MAX_FILL = 0.875


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, *, k_new=None, v_new=None, page_table=None,
                           causal: bool = True, scale: float | None = None, window: tuple[int, int] | None = None,
                           softcap: float = 0.0, sinks=None, return_lse: bool = False, num_splits: int = 0,
                           out=None, check: bool = False, block_n: int = 0, stages: int = 0, gather: bool | None = None,
                           ctas_per_sm: int = 0, pdl: bool = True, swap: bool | None = None, head_pack: int = 0):
    """Attention of q (B, S_q, H, D) over each sequence's cache: k_cache, v_cache (B_cache, S_max, H_kv, D),
    B_cache >= B, sequence b's first cache_seqlens[b] rows (an int32 (B,) tensor on q's device). Paged: k_cache,
    v_cache (num_pages, page_size, H_kv, D) with page_size a power of two in 1..256 (1-row pages at D=96 only gathered), and
    page_table an int32 (B, max_pages) tensor on the device whose row b lists the pages holding sequence b's keys
    in order (its capacity is max_pages * page_size; the kernel reads no entry past a sequence's last page).

    k_new, v_new (B, S_q, H_kv, D): written into the cache in place at rows cache_seqlens[b] .. + S_q - 1
    first, and attended; cache_seqlens itself is not changed (advance it yourself, as with FlashAttention).
    Query token t of a sequence of L keys (after the append) sits at position L - S_q + t: `causal` lets it
    see keys up to its position, `window=(left, right)` (-1: unbounded) those within [position - left,
    position + right]. `softcap` > 0 caps the scaled scores as softcap * tanh(scores / softcap). `sinks`, a
    float32 (H,) tensor, adds exp(sinks[h]) to every row's softmax denominator (learned attention sinks);
    the returned logsumexp (B, H, S_q, float32) includes it. `num_splits` (0: chosen from the batch, the K/V
    heads, the cache's capacity, its page size and the SM count) cuts each tile's keys into that many CTAs, merged
    in the kernel. `out`: a tensor of q's shape and dtype to write o into (any 16-byte strides, head dim contiguous).
    `gather` (paged caches): True copies the pages' rows 16 bytes a thread by cp.async, False by a TMA copy per
    page; None (the default) gathers pages of up to 8 rows, where a TMA copy per page is slower (bench/LOG.md,
    "Decode", d8, and d35). `ctas_per_sm` (0: chosen) 1 runs two consumer warpgroups per CTA, 2 one per CTA and two
    CTAs per SM (tiles of at most 64 packed rows, D <= 128); chosen where the tiles fill the SMs with one split each, and
    where fewer tiles than SMs are split into most of a wave of CTAs (choose_ctas_per_sm).
    `block_n` and `stages` (0: chosen) set the kernel's key block and ring depth. `pdl` (default True) launches the
    kernel(s) by programmatic dependent launch where the splits are not one cluster: a call's CTAs may start while
    the stream's previous kernel finishes, and wait for its writes before they read any input, so kernels back to
    back on a stream lose less of a launch gap between them (bench/LOG.md, "Decode", d14). `swap` (None: chosen)
    True runs the swapped products (S^T = K Q^T, O^T = V^T P^T: the packed rows as wgmma's N, for tiles of up to
    16 rows), False the plain ones (the rows as wgmma's M of 64); chosen where they apply (bench/LOG.md d18).
    `head_pack` (0: chosen) 2 or 4 has each CTA take that many adjacent K/V heads, loaded by one box (256-byte
    pieces of each key's row at D=64; choose_head_pack picks 2 there for dense caches), 1 one head; over a paged
    cache a pack loads each page's rows of its heads by TMA (not gathered; measured no faster at D=128, d25).

    What cannot be checked without reading device memory: that every cache_seqlens[b] (+ S_q with k_new)
    is at most the capacity, and that the page table's entries a sequence uses are pages of the cache.
    `check=True` copies cache_seqlens (and the page table) to the host and checks them (a synchronization).

    Under torch.compile the call is a custom op (codegen.torch_op; with k_new the one that writes the caches), so a
    decode step compiles as one graph; `out=` and `check=True` break it. A call without `check` can be captured in
    a CUDA graph once the same call has run outside the capture (which compiles and loads the kernel); a captured
    launch of several splits has a workspace of its own, so a graph may replay on any stream.
    """
    _require_torch("codegen.attention_with_kvcache()")
    import torch

    # Types first (1.0 == 1 == True would find a launcher made for an int): what follows compares values only.
    if not type(num_splits) is type(block_n) is type(stages) is type(ctas_per_sm) is type(head_pack) is int or (
            window is not None and not _is_int_pair(window)):
        _refuse_option_types(num_splits=num_splits, block_n=block_n, stages=stages, ctas_per_sm=ctas_per_sm,
                             head_pack=head_pack, window=window)
    if torch.compiler.is_compiling():  # torch.compile traces the custom ops (codegen.torch_op), not this body
        from .torch_op import compiled_attention_with_kvcache

        return compiled_attention_with_kvcache(
            q, k_cache, v_cache, cache_seqlens, k_new=k_new, v_new=v_new, page_table=page_table, return_lse=return_lse,
            out=out, check=check, causal=causal, scale=scale, window=window, softcap=softcap, sinks=sinks,
            num_splits=num_splits, block_n=block_n, stages=stages, gather=gather, ctas_per_sm=ctas_per_sm, pdl=pdl,
            swap=swap, head_pack=head_pack)
    key = None
    try:  # everything the first call's checks read, so that a call the key finds would pass them all
        key = (_facts(q), _facts(k_cache), _facts(v_cache), _facts(cache_seqlens), _facts(k_new), _facts(v_new),
               _facts(page_table), _facts(sinks), bool(causal), scale, None if window is None else tuple(window),
               float(softcap), num_splits, block_n, stages, gather, ctas_per_sm, bool(pdl), swap, head_pack)
        launcher = _LAUNCHERS.get(key)
    except (AttributeError, TypeError):  # not tensors, or unhashable: the checks below say what is wrong
        key, launcher = None, None
    if launcher is None:
        launcher = _make_launcher(q, k_cache, v_cache, cache_seqlens, k_new, v_new, page_table, causal, scale,
                                  window, softcap, sinks, num_splits, block_n, stages, gather, ctas_per_sm,
                                  bool(pdl), swap, head_pack)
        if key is not None:
            _api.remember(_LAUNCHERS, key, launcher, MAX_LAUNCHERS)
    # The per-call checks, written out: this is the hot path of a decode step (host time: bench/LOG.md d17).
    if torch.is_grad_enabled() and (q.requires_grad or k_cache.requires_grad or v_cache.requires_grad or (
            k_new is not None and (k_new.requires_grad or v_new.requires_grad)) or (
            sinks is not None and sinks.requires_grad)):
        raise InputError(NO_BACKWARD)
    if (q.data_ptr() | k_cache.data_ptr() | v_cache.data_ptr()) % 16 or (k_new is not None and (
            k_new.data_ptr() | v_new.data_ptr()) % 16) or (sinks is not None and sinks.data_ptr() % 4):
        _check_alignment((q, k_cache, v_cache) + (() if k_new is None else (k_new, v_new)))
    if check:
        _check_lengths(cache_seqlens, page_table, k_cache.shape[0], k_cache.shape[1], 0 if k_new is None else q.shape[1])
    if out is None:
        o = torch.empty_like(q, memory_format=torch.contiguous_format)
    else:
        _check_out(out, q)
        o = out
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device) if return_lse else None
    launcher(_current_stream(q.device), q, k_cache, v_cache, cache_seqlens, k_new, v_new, sinks, o, lse, page_table)
    return (o, lse) if return_lse else o


def _is_int_pair(window) -> bool:
    return isinstance(window, (tuple, list)) and len(window) == 2 and type(window[0]) is type(window[1]) is int


def _refuse_option_types(window, **ints) -> None:
    for name, value in ints.items():
        if type(value) is not int:
            raise InputError(f"{name} must be an int (0: chosen for the shape), got {value!r}")
    raise InputError(f"window must be (left, right), two ints (-1: unbounded), got {window!r}")


def _facts(t):
    """What the checks read of a tensor argument (None: not given): each one's part of the launcher's key."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def choose_ctas_per_sm(spec: DecodeSpec, tiles: int, splits: int, sms: int, two_ctas: bool | None = None) -> int:
    """CTAs per SM for `tiles` tiles of `splits` splits each: two (one consumer warpgroup each) where the tile fits
    that layout and either one-split tiles fill TWO_CTA_MIN_WAVES waves (d24), for a paged cache at any count and for a
    dense one up to TWO_CTA_MAX_WAVES waves, or fewer tiles than SMs are split into at least SPLIT_TWO_CTA_MIN_FILL of
    the SMs' worth of CTAs (d26); one (two consumers sharing a CTA's loads) elsewhere. Measured against cuDNN in one
    process (bench/LOG.md, "Decode", d11): 32 x 2k 0.970x -> 1.004x, pages of 4 0.720x -> 0.927x, of 16 0.952x ->
    0.990x; 128 x 8k 1.016x -> 1.000x (so dense caches of many waves keep one); B=1 slower (7.6 -> 8.2 us). d26 (H100,
    D=128 32/8 heads unless said): split tiles at B=2 to 8, one consumer a CTA at the same splits, 8k / 32k keys: B=8
    1.031x -> 1.049x / 1.008x -> 1.026x, B=6 1.023x -> 1.099x / 1.000x -> 1.072x, B=4 0.990x -> 1.018x / 0.959x -> 0.980x,
    B=3 1.046x -> 1.086x / 0.995x -> 1.033x, B=2 1.082x -> 1.109x / 0.987x -> 1.034x; D=64, S_q=4 and 64/8 heads +1.6-4.6%;
    but B=1 (8 tiles of 8 splits: 64 CTAs, half the SMs) 1.076x -> 1.040x at 32k. Gathered pages take two a SM from
    just past one wave of one-CTA tiles: B=24 x 2k over 8-row pages 0.851x -> 0.969x, 4-row 0.796x -> 0.983x (d38).
    `two_ctas`: whether the tiles fit two CTAs a SM, where the caller already asked two_ctas_fit (None: ask it)."""
    if splits > 1 and tiles < sms:
        wanted = tiles * splits >= SPLIT_TWO_CTA_MIN_FILL * sms
    elif spec.gather:  # past a wave of one-CTA tiles, one wave of two a SM (d38)
        wanted = splits == 1 and tiles > sms
    else:
        waves_ok = spec.page_size > 0 or tiles <= TWO_CTA_MAX_WAVES * sms
        wanted = splits == 1 and tiles >= TWO_CTA_MIN_WAVES * sms and waves_ok
    return 2 if wanted and (two_ctas_fit(spec) if two_ctas is None else two_ctas) else 1


def two_ctas_fit(spec: DecodeSpec) -> bool:
    """Whether the call's tiles can run two CTAs a SM (one consumer warpgroup each)."""
    if not spec.fits_two_ctas:
        return False
    try:
        resolve(spec.replace(ctas_per_sm=2))
    except SpecError:  # the call's own block_n or stages do not fit half the SM
        return False
    return True


def choose_head_pack(spec: DecodeSpec, tiles: int, sms: int) -> int:
    """K/V heads per tile, given `tiles` one-head tiles on `sms` SMs: two where a head's row is one
    HEAD_PACK_PIECE_BYTES piece, the two-head tiles all but fill the SMs (HEAD_PACK_IDLE_SMS) and the pair's rows
    fit the swapped products; else one. On an H100 (bench/LOG.md d23, D=64, 32/8 heads, against cuDNN in one
    process): 32 x 8k (128 two-head tiles) 0.960x -> 1.001x, 128 x 2k 1.000x -> 1.025x, 32 x 2k 1.004x -> 1.028x, S_q=2
    at 32 x 8k +3.7%; where the two-head tiles leave a quarter of the SMs idle, 17-24 x 8k, they ran 0.84-0.89x
    (d24), 8 x 32k (tiles few enough to split) lost (0.977x -> 0.952x), and at D=128 (256-byte pieces) it ties.
    Paged caches keep one head: packs of 2 and 4 over pages of 4 and 16 rows tied or lost at D=128 (d25)."""
    if spec.page_size or spec.head_dim * spec.elem_bytes > HEAD_PACK_PIECE_BYTES \
            or tiles // 2 < sms - sms // HEAD_PACK_IDLE_SMS:
        return 1
    try:
        resolve(spec.replace(head_pack=2))
    except SpecError:  # paged, an odd number of K/V heads, the plain products, more rows than N holds
        return 1
    return 2


def choose_splits(ctas: int, blocks: int, sms: int, *, small_pages: bool = False, gathered: bool = False,
                  two_ctas: bool = False) -> int:
    """Splits of each tile's `blocks` key blocks for `ctas` tiles on `sms` SMs, by how much of a wave of one-CTA tiles
    there is. `small_pages`: at most SMALL_PAGE_ROWS rows a page (gathered or by TMA), whose CTAs stream slower than a
    dense cache's, so they take more CTAs (larger pages plan as "dense" below); `gathered`: pages copied by cp.async
    (slower still); `two_ctas`: the tiles fit two CTAs a SM. Each rule's measurements are in bench/LOG.md ("Decode",
    the entries named):

    | tiles / SMs | cache                                    | splits                                    | entry     |
    |-------------|------------------------------------------|-------------------------------------------|-----------|
    | <= 1/3      | dense                                    | a wave, 9-16 folded into a cluster of 8   | d10, d15b |
    | <= 1/3      | small pages                              | a wave, plain (gathered, 2 CTAs a SM: 2x) | d36-d40   |
    | 1/3 - 1     | small pages, two CTAs a SM fit           | a wave, at least two                      | d37, d39  |
    | 1/3 - 1     | gathered, two CTAs a SM do not fit       | a wave                                    | d37       |
    | 1/2 - 7/8   | dense, two CTAs a SM fit                 | two (DENSE_TWO_SPLIT_MAX_FILL)            | d41       |
    | 1/3 - 1     | dense, otherwise                         | a wave of SPLIT_MIN_BLOCKS-block splits   | d10       |
    | 1 - 1.25    | dense; small pages to 1.4 waves (but not | two of SPLIT_MIN_BLOCKS blocks            | d24, d42  |
    |             | gathered ones at two CTAs a SM)          |                                           |           |
    | more        |                                          | one                                       |           |

    Every split keeps MIN_BLOCKS_PER_SPLIT blocks or more. fit_clusters then trims a count whose clusters would not all
    be resident below a wave, and choose_ctas_per_sm takes two CTAs a SM for split tiles that fill most of the SMs."""
    small_pages = small_pages or gathered
    two_split_waves = SMALL_PAGE_TWO_SPLIT_MAX_WAVES if small_pages else TWO_SPLIT_MAX_WAVES
    if sms < ctas < two_split_waves * sms and not (gathered and two_ctas):
        return max(1, min(2, blocks // SPLIT_MIN_BLOCKS))
    if ctas >= sms:
        return 1
    if ctas * FEW_TILES <= sms:
        wave = (max(CTAS_PER_SM) if gathered and two_ctas else 1) * sms // ctas
        splits = max(1, min(MAX_SPLITS, wave, blocks // MIN_BLOCKS_PER_SPLIT))
        folds = not small_pages and MAX_CLUSTER_SPLITS < splits <= 2 * MAX_CLUSTER_SPLITS
        return MAX_CLUSTER_SPLITS if folds else splits
    if small_pages and two_ctas:
        return max(1, min(MAX_SPLITS, max(2, sms // ctas), blocks // MIN_BLOCKS_PER_SPLIT))
    if gathered:
        return max(1, min(MAX_SPLITS, sms // ctas, blocks // MIN_BLOCKS_PER_SPLIT))
    if two_ctas and sms < 2 * ctas <= 2 * DENSE_TWO_SPLIT_MAX_FILL * sms:
        return max(1, min(2, blocks // MIN_BLOCKS_PER_SPLIT))
    return max(1, min(MAX_SPLITS, sms // ctas, blocks // SPLIT_MIN_BLOCKS))


def fit_clusters(plan: Plan, tiles: int, splits: int, resident) -> int:
    """Chosen splits, fewer where a tile's splits launch as one cluster but not every tile's cluster is resident at
    once (`resident(size)`: clusters of that size the device holds; a GPC takes whole clusters only): the most
    splits whose clusters all fit. At B=2 x 8k, 16 clusters of 8 ran 0.76x cuDNN (bench/LOG.md, "Decode", d15)."""
    while plan.cluster_dims(splits) is not None and resident(splits) < tiles:
        splits -= 1
    return splits


class DecodeLauncher:
    """One checked call signature's kernels, argument buffers, tensor maps and workspace (per stream)."""

    def __init__(self, built, kernel, append_kernel, map_params, batch, splits, scale, overlap: bool = False):
        from . import driver

        self.built, self.kernel, self.append_kernel = built, kernel, append_kernel
        plan = built.plan
        self.plan, self.map_params, self.batch, self.splits = plan, map_params, batch, splits
        self.grid = plan.grid(batch, splits)
        from .launcher import TensorMapCache, kernel_launch

        self.cluster = plan.cluster_dims(splits)  # a tile's splits as one cluster, started together
        # Programmatic dependent launch (the kernels griddepcontrol.wait before any input read), but not for a cluster
        # launch: back to back, B=1 x 32k with 8 clustered splits took 52 us a call with it, 40 without (bench/LOG.md d14).
        self.overlap = overlap and self.cluster is None
        self._launch = kernel_launch(kernel, self.grid, plan.threads, self.cluster, self.overlap)
        values = {p.name: 0 for p in plan.abi.params}
        values.update(tmap_k=bytes(driver.TENSOR_MAP_BYTES), tmap_v=bytes(driver.TENSOR_MAP_BYTES), splits=splits,
                      scale_log2=float(scale * LOG2E))
        self._args = plan.abi.pack(values)
        self._holder = dict(zip(plan.abi.names, self._args.holders))
        self._append_args = plan.append_abi.pack({p.name: 0 for p in plan.append_abi.params})
        self._append_holder = dict(zip(plan.append_abi.names, self._append_args.holders))
        self._maps = {op: TensorMapCache(params, MAPS_PER_CACHE) for op, params in map_params.items()}
        self._loaded = {"k": None, "v": None}
        # What every call of this launcher shares (the call's key fixes them), looked up once.
        self._gathered = plan.spec.gather
        self._elem_bytes = plan.spec.elem_bytes
        self._append_launch = kernel_launch(append_kernel, plan.append_grid(batch), plan.append_threads, None,
                                            self.overlap)
        self._strides_set = False
        self._workspace: dict[int, tuple] = {}  # stream -> (addresses, the DeviceBuffers at them)
        # Splits merge through the workspace (partial rows, and the last split's counter where not a cluster) unless
        # they push their rows into split 0's shared memory (a cluster launch of a push-merge plan): empty ones then.
        self._uses_workspace = splits > 1 and not (plan.push_merge and self.cluster is not None)
        self._lock = threading.Lock()
        # What a call writes, in the order __call__ lists the values; written only where they changed since the
        # launcher's last call (a decode loop hands the same addresses back), as are o's strides.
        h = self._holder
        self._per_call = tuple(h[name] for name in self.PER_CALL + (self.GATHER_PER_CALL if self._gathered else ()))
        self._o_holders = (h["o_batch_bytes"], h["o_row_bytes"], h["o_head_bytes"])
        self._last_values, self._last_o_strides = None, None
        self._map_slots = tuple((op, ctypes.addressof(h[f"tmap_{op}"])) for op in ("k", "v") if op in self._maps)

    PER_CALL = ("q_gmem", "o_gmem", "lse_out", "cache_seqlens", "page_table", "sinks", "ws_o", "ws_lse",
                "split_counter")
    GATHER_PER_CALL = ("k_cache_gmem", "v_cache_gmem")  # a gathering kernel reads the caches by address

    def _workspace_for(self, stream: int, device) -> tuple[tuple[int, int, int], tuple]:
        """((ws_o, ws_lse, split_counter) addresses, what holds them) for a launch on `stream`, under the lock.
        Eager launches on a stream share one (the counter is left zero by every launch, and they run in order),
        outside torch's allocator (driver.DeviceBuffer, freed with the launcher); another stream gets its own. A
        launch captured into a CUDA graph gets a fresh one from the capture's memory pool (its counter zeroed by a
        captured memset before every replay): the graph owns it, freed with it, and a graph may replay on any
        stream beside eager calls and other graphs. Launches that merge without one get (0, 0, 0)."""
        import torch

        from . import driver

        if not self._uses_workspace:
            return (0, 0, 0), ()
        tiles = self.batch * self.grid[1]
        rows = tiles * max(self.splits, 1) * self.plan.block_m
        sizes = (rows * self.plan.spec.head_dim * 4, rows * 4, tiles * 4)  # float partial rows, float lse, int counter
        if torch.cuda.is_current_stream_capturing():
            tensors = (torch.empty(sizes[0] // 4, dtype=torch.float32, device=device),
                       torch.empty(sizes[1] // 4, dtype=torch.float32, device=device),
                       torch.zeros(sizes[2] // 4, dtype=torch.int32, device=device))
            return tuple(t.data_ptr() for t in tensors), tensors
        ws = self._workspace.get(stream)
        if ws is None:
            buffers = tuple(driver.DeviceBuffer(n, device.index or 0) for n in sizes)
            buffers[2].zero(stream)  # the counter; the partial rows are written before they are read
            ws = self._workspace[stream] = (tuple(b.address for b in buffers), buffers)
        return ws

    def __call__(self, stream, q, k_cache, v_cache, cache_seqlens, k_new, v_new, sinks, o, lse, page_table=None) -> None:
        pages = 0 if page_table is None else page_table.data_ptr()
        o_strides = (o.stride(0), o.stride(1), o.stride(2))  # `out` may be any 16-byte strides
        with self._lock:
            # `workspace` holds a captured launch's tensors until the launch is in the graph
            addresses, workspace = self._workspace_for(stream, q.device)
            values = (q.data_ptr(), o.data_ptr(), 0 if lse is None else lse.data_ptr(), cache_seqlens.data_ptr(),
                      pages, 0 if sinks is None else sinks.data_ptr()) + addresses + (
                      (k_cache.data_ptr(), v_cache.data_ptr()) if self._gathered else ())
            for op, address in self._map_slots:
                encoded = self._maps[op].get(k_cache.data_ptr() if op == "k" else v_cache.data_ptr())
                if self._loaded[op] is not encoded:
                    ctypes.memmove(address, encoded, len(encoded))
                    self._loaded[op] = encoded
            if not self._strides_set:  # the call's key holds every stride but o's: set once
                self._set_strides(q, k_cache, v_cache, k_new, v_new, page_table)
            if values != self._last_values:
                for holder, value in zip(self._per_call, values):
                    holder.value = value
                self._last_values = values
            if o_strides != self._last_o_strides:
                for holder, stride in zip(self._o_holders, o_strides):
                    holder.value = stride * self._elem_bytes
                self._last_o_strides = o_strides
            if k_new is not None:
                a = self._append_holder
                a["k_new_gmem"].value, a["v_new_gmem"].value = k_new.data_ptr(), v_new.data_ptr()
                a["k_cache_gmem"].value, a["v_cache_gmem"].value = k_cache.data_ptr(), v_cache.data_ptr()
                a["cache_seqlens"].value, a["page_table"].value = values[3], pages
                self._append_launch(stream, self._append_args)
            self._launch(stream, self._args)
            del workspace  # launched (or captured): a captured one is the graph's from here

    def _set_strides(self, q, k_cache, v_cache, k_new, v_new, page_table) -> None:
        """The byte strides of the call's tensors (o's aside), fixed for every call this launcher serves."""
        h = self._holder
        for name, t in (("q", q),) + ((("k_cache", k_cache), ("v_cache", v_cache)) if self._gathered else ()):
            self._set_byte_strides(h, name, t)
        h["page_table_stride"].value = 0 if page_table is None else page_table.stride(0)
        h["page_table_cols"].value = 0 if page_table is None else page_table.shape[1]
        h["new_tokens"].value = 0 if k_new is None else q.shape[1]
        if k_new is not None:
            a = self._append_holder
            for name, t in (("k_new", k_new), ("v_new", v_new), ("k_cache", k_cache), ("v_cache", v_cache)):
                self._set_byte_strides(a, name, t)
            a["page_table_stride"].value = h["page_table_stride"].value
        self._strides_set = True

    def _set_byte_strides(self, holders, name: str, t) -> None:
        """A strided tensor's (batch, row, head) byte strides into its three ABI parameters."""
        e = self._elem_bytes
        holders[f"{name}_batch_bytes"].value, holders[f"{name}_row_bytes"].value, holders[f"{name}_head_bytes"].value = (
            t.stride(0) * e, t.stride(1) * e, t.stride(2) * e)


@functools.lru_cache(maxsize=64)
def _loaded(spec: DecodeSpec, device_index: int):
    from . import driver
    from .families.decode_sm90 import append_name

    built = _build.build(spec, family="decode_sm90")
    kernel = driver.load(built.compiled.cubin, built.rendered.kernel_name, built.plan.smem.total, device_index)
    return built, kernel, driver.sibling(kernel, append_name(built.spec))


def _make_launcher(q, k_cache, v_cache, cache_seqlens, k_new, v_new, page_table, causal, scale, window, softcap,
                   sinks, num_splits, block_n, stages, gather, ctas_per_sm, pdl=True, swap=None,
                   head_pack=0) -> DecodeLauncher:
    """Every check of a new call signature, then its kernel and launcher; InputError before any launch."""
    import torch

    from . import driver

    batch, q_len, heads, dim, kv_heads, capacity = _check_shapes(q, k_cache, v_cache, k_new, v_new, page_table)
    page_size = 0 if page_table is None else k_cache.shape[1]
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32 or cache_seqlens.dim() != 1:
        raise InputError("cache_seqlens must be a 1-D torch.int32 tensor of the B sequence lengths, got "
                         + (f"{cache_seqlens.dtype} of shape {tuple(cache_seqlens.shape)}"
                            if isinstance(cache_seqlens, torch.Tensor) else type(cache_seqlens).__name__))
    if cache_seqlens.device != q.device:
        raise InputError(f"cache_seqlens must be on q's device {q.device} (the kernel reads it there), got "
                         f"{cache_seqlens.device}")
    if cache_seqlens.shape[0] != batch:
        raise InputError(f"cache_seqlens must hold one length per sequence ({batch}), got {cache_seqlens.shape[0]}")
    if cache_seqlens.stride(0) != 1:
        raise InputError("cache_seqlens must be contiguous; call .contiguous()")
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor) or sinks.dtype != torch.float32 or tuple(sinks.shape) != (heads,):
            raise InputError(f"sinks must be a float32 tensor of shape ({heads},) (one logit per query head), got "
                             + (f"{sinks.dtype} of shape {tuple(sinks.shape)}" if isinstance(sinks, torch.Tensor)
                                else type(sinks).__name__))
        if sinks.device != q.device or sinks.stride(0) != 1:
            raise InputError(f"sinks must be contiguous and on q's device {q.device}")
    if scale is None:
        scale = 1.0 / math.sqrt(dim)
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise InputError(f"scale must be a positive finite number, got {scale!r}")
    if not isinstance(num_splits, int) or not 0 <= num_splits <= MAX_SPLITS:
        raise InputError(f"num_splits must be 0 (chosen for the shape) or 1..{MAX_SPLITS}, got {num_splits!r}")
    if not isinstance(ctas_per_sm, int) or ctas_per_sm not in (0,) + CTAS_PER_SM:
        raise InputError(f"ctas_per_sm must be 0 (chosen for the shape) or one of {CTAS_PER_SM}, got {ctas_per_sm!r}")
    if swap not in (None, True, False):
        raise InputError(f"swap must be True, False or None (chosen for the shape), got {swap!r}")
    if type(head_pack) is not int or head_pack not in (0,) + HEAD_PACKS:
        raise InputError(f"head_pack must be 0 (chosen for the shape) or one of {HEAD_PACKS}, got {head_pack!r}")
    if q.device.type != "cuda":
        raise InputError(f"the inputs are on {q.device}; flashgen kernels run on a CUDA device")
    try:
        arch = _device_arch(q.device)
        if arch != "sm_90a":
            raise InputError(f"the decode kernel is generated for sm_90a (H100/H200) only so far, not {arch}")
        spec = DecodeSpec(heads=heads, kv_heads=kv_heads, head_dim=dim, q_len=q_len,
                          dtype=BY_TORCH_NAME[str(q.dtype).split(".")[-1]].name, causal=bool(causal),
                          window=tuple(window) if window else (-1, -1), softcap=float(softcap), block_n=block_n,
                          stages=stages, page_size=page_size,
                          gather=gather_by_default(page_size, gather, head_pack),
                          ctas_per_sm=ctas_per_sm or 1, swap=None if swap is None else bool(swap),
                          head_pack=head_pack or 1)
        sms = _sm_count(q.device.index or 0)
        if not head_pack:
            head_tiles = batch * Plan(resolve(spec.replace(ctas_per_sm=1))).grid(batch, 1)[1]
            spec = spec.replace(head_pack=choose_head_pack(spec, head_tiles, sms))
        one_cta = resolve(spec.replace(ctas_per_sm=1))
        plan = Plan(one_cta)
        if plan.grid(batch, 1)[1] > MAX_GRID_YZ or batch > MAX_GRID_YZ:
            raise InputError(f"batch {batch} and {kv_heads} K/V heads x {plan.tiles_m} row tiles exceed the grid's "
                             f"{MAX_GRID_YZ} limit")
        tiles = batch * plan.grid(batch, 1)[1]
        two_ctas = ctas_per_sm == 2 or (not ctas_per_sm and two_ctas_fit(spec))
        splits = num_splits or choose_splits(tiles, -(-capacity // one_cta.block_n), sms,
                                             small_pages=0 < page_size <= SMALL_PAGE_ROWS,
                                             gathered=spec.gather, two_ctas=two_ctas)
        if not ctas_per_sm:
            spec = spec.replace(ctas_per_sm=choose_ctas_per_sm(spec, tiles, splits, sms, two_ctas))
        spec = resolve(spec)
    except (SpecError, TypeError) as e:
        raise InputError(str(e)) from None
    built, kernel, append_kernel = _loaded(spec, q.device.index or 0)
    plan = built.plan
    if not num_splits and tiles < sms:  # more tiles than SMs run in waves: their clusters need not all be resident
        splits = fit_clusters(plan, tiles, splits, functools.partial(driver.resident_clusters, kernel, plan.threads))
    map_params = {}  # a gathering kernel reads the caches by address, through no tensor map
    for op, cache in () if spec.gather else (("k", k_cache), ("v", v_cache)):
        strides = [cache.stride(a) if cache.shape[a] > 1 else cache.shape[3] for a in (0, 1, 2)]
        try:
            if page_size:
                map_params[op] = getattr(plan, f"{op}_pages").instantiate(
                    num_pages=cache.shape[0], heads=kv_heads, stride_page=strides[0], stride_row=strides[1],
                    stride_h=strides[2])
            else:
                map_params[op] = getattr(plan, op).tensor_map.instantiate(
                    batch=cache.shape[0], seq_len=capacity, heads=kv_heads, stride_b=strides[0],
                    stride_s=strides[1], stride_h=strides[2])
        except LayoutError as err:
            raise InputError(f"{op}_cache: {err}") from None
    return DecodeLauncher(built, kernel, append_kernel, map_params, batch, splits, float(scale), overlap=pdl)


def _check_shapes(q, k_cache, v_cache, k_new, v_new, page_table):
    """(B, S_q, H, D, H_kv, capacity) of a well-formed call, or the InputError that says what is wrong."""
    import torch

    named = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)]
    if (k_new is None) != (v_new is None):
        raise InputError("pass k_new and v_new together (or neither)")
    if k_new is not None:
        named += [("k_new", k_new), ("v_new", v_new)]
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise InputError(f"{name} must have rank 4, got shape {tuple(t.shape)}")
        if str(t.dtype).split(".")[-1] not in BY_TORCH_NAME:
            raise InputError(f"{name} has dtype {t.dtype}; supported: " + ", ".join(f"torch.{d}" for d in BY_TORCH_NAME))
        if t.dtype != q.dtype:
            raise InputError(f"{name} has dtype {t.dtype}, q {q.dtype}: every tensor must share one dtype")
        if t.device != q.device:
            raise InputError(f"{name} is on {t.device}, q on {q.device}: every tensor must be on one device")
        if t.stride(-1) != 1:
            raise InputError(f"{name}'s head dimension must be contiguous (stride 1); call .contiguous()")
        for axis in range(3):
            if t.shape[axis] > 1 and (t.stride(axis) * t.element_size()) % 16:
                raise InputError(f"{name}.stride({axis}) = {t.stride(axis)} elements is not a multiple of 16 bytes")
    batch, q_len, heads, dim = q.shape
    b_cache, rows, kv_heads, dim_k = k_cache.shape
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise InputError(f"k_cache and v_cache must have one shape, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if dim_k != dim:
        raise InputError(f"q's head dim {dim} and the cache's {dim_k} differ")
    if min(batch, q_len, heads, rows, kv_heads) < 1:
        raise InputError(f"every dimension must be at least 1, got q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}")
    if page_table is None:
        capacity = rows
        if b_cache < batch:
            raise InputError(f"the cache holds {b_cache} sequences, q {batch}")
    else:
        if not isinstance(page_table, torch.Tensor) or page_table.dtype != torch.int32 or page_table.dim() != 2:
            raise InputError("page_table must be a 2-D torch.int32 tensor (B, max_pages), got "
                             + (f"{page_table.dtype} of rank {page_table.dim()}" if isinstance(page_table, torch.Tensor)
                                else type(page_table).__name__))
        if page_table.device != q.device:
            raise InputError(f"page_table must be on q's device {q.device} (the kernel reads it there), got "
                             f"{page_table.device}")
        if page_table.shape[0] != batch or page_table.shape[1] < 1:
            raise InputError(f"page_table must have a row of pages per sequence, (B={batch}, max_pages >= 1), got "
                             f"{tuple(page_table.shape)}")
        if page_table.stride(1) != 1:
            raise InputError("page_table's rows must be contiguous; call .contiguous()")
        capacity = page_table.shape[1] * rows
    if heads % kv_heads:
        raise InputError(f"q's {heads} heads must be a multiple of the cache's {kv_heads} K/V heads")
    if k_new is not None:
        for name, t in (("k_new", k_new), ("v_new", v_new)):
            if tuple(t.shape) != (batch, q_len, kv_heads, dim):
                raise InputError(f"{name} must be (B, S_q, H_kv, D) = {(batch, q_len, kv_heads, dim)}, got {tuple(t.shape)}")
        if q_len > capacity:
            raise InputError(f"{q_len} new tokens do not fit a cache of {capacity} rows")
    if capacity >= 2**30 or b_cache >= 2**31:
        raise InputError(f"a cache of {capacity} rows ({b_cache} entries) is over the kernel's 32-bit coordinates")
    return batch, q_len, heads, dim, kv_heads, capacity


def _check_out(out, q) -> None:
    import torch

    if not isinstance(out, torch.Tensor) or out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise InputError(f"out must be a tensor of q's shape {tuple(q.shape)}, dtype {q.dtype} and device {q.device}")
    shape, strides, size = out.shape, out.stride(), out.element_size()
    if strides[3] != 1 or out.data_ptr() % 16 or any(shape[a] > 1 and strides[a] * size % 16 for a in range(3)):
        raise InputError("out's head dimension must be contiguous, its other strides multiples of 16 bytes, and its "
                         "data pointer 16-byte aligned")


def _check_alignment(tensors) -> None:
    for t in tensors:
        if t.data_ptr() % 16:
            raise InputError("every tensor's data pointer must be 16-byte aligned (a slice that starts mid-row is not)")


def _check_lengths(cache_seqlens, page_table, cache_rows: int, rows: int, new_tokens: int) -> None:
    """Reads cache_seqlens (and the page table) back: every length within the capacity, every page used real."""
    lengths = cache_seqlens.tolist()
    capacity = rows if page_table is None else rows * page_table.shape[1]
    table = None if page_table is None else page_table.tolist()
    for b, n in enumerate(lengths):
        if n < 0 or n + new_tokens > capacity:
            raise InputError(f"sequence {b}: cache_seqlens {n}" + (f" + {new_tokens} new tokens" if new_tokens else "")
                             + f" is outside the cache's 0..{capacity} rows")
        if table is not None:
            used = table[b][:-(-(n + new_tokens) // rows)]
            bad = [p for p in used if not 0 <= p < cache_rows]
            if bad:
                raise InputError(f"sequence {b}: page_table names page {bad[0]}, outside the cache's {cache_rows} pages")
