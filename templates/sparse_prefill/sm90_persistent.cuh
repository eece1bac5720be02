#pragma once
// Which items (token x head tile) a CTA of the Hopper sparse prefill works on: one item or part of one
// per CTA (the fp8 kernels: cta_work), or the persistent walk of the bf16 kernel, every role going over the same
// items with the grid's stride, with the tail split that spreads the last round's items over the
// whole grid as parts (sparse_prefill/sm90_combine.cuh merges them).
#include "sparse_prefill/sm90_config.cuh"
#include "sparse_prefill/sm90_producer.cuh"
#include "sparse_prefill/sm90_consumer.cuh"

namespace mj {
namespace sparse_prefill_sm90 {

// This CTA's item: one token x one head tile, its top-k length (clamped to the stride) and the
// number of 128-key steps (two 64-key blocks each). With a tail split, a part of an item whose
// result goes to partial slot `slot` (-1: the whole item, written to out / lse): the persistent
// kernel's parts are steps [step0, step0 + steps) of the item; the one-item kernels' are 64-key
// blocks (part_blocks), so a part may end in a half step. Either way the part's slots start at
// first_slot and end at topk_len.
struct CtaWork {
  i64 token;
  int head0, topk_len, steps;
  int step0, slot;
  int first_slot;
};
// Part `part` of 2^shift of an item in 64-key blocks: blocks [b0, b1) of its ceil(topk_len / 64),
// i.e. slots [64 b0, min(topk_len, 64 b1)), in ceil((b1 - b0) / 2) steps (the last one's second
// block is past topk_len when the part's blocks are odd: its rows are invalid, and the block
// schedule skips it). Blocks rather than steps balance ragged rows: 24 blocks in 16 parts run 1 or 2
// each, where 12 steps left 4 parts empty and 12 with a whole step.
MJ_DEVICE void part_blocks(CtaWork& w, int part, int shift) {
  const int blocks = (w.topk_len + kBlockKeys - 1) / kBlockKeys;
  const int b0 = static_cast<int>((static_cast<i64>(part) * blocks) >> shift);
  const int b1 = static_cast<int>((static_cast<i64>(part + 1) * blocks) >> shift);
  w.first_slot = b0 * kBlockKeys;
  w.steps = (b1 - b0 + 1) / 2;
  w.topk_len = min(w.topk_len, b1 * kBlockKeys);
}
// The first slot of part `part` of a one-item kernel's full-length row (part_blocks): the index
// hint, issued before the row's length is known.
MJ_DEVICE i64 part_first_slot_hint(const SparsePrefillArgs& args, i64 part) {
  const i64 blocks = (args.indices_stride + kBlockKeys - 1) / kBlockKeys;
  return ((part * blocks) >> args.split_shift) * kBlockKeys;
}
// Tail split (persistent kernel; args.split_shift > 0, parts = 2^split_shift). The walk goes over
// units: unit u < split_first is item u, whole; the units after it are the parts of items
// split_first, ...: unit split_first + k is part k % parts of item split_first + k / parts, and
// writes partial slot k. (Powers of two: shifts instead of divisions in every role's walk; with
// divisions the kernel grew by ~800 SASS instructions and its cold compile by ~0.3 s.)
// Why: items = tokens x head tiles rarely divide by the grid (4096 tokens x 2 tiles on 132 SMs: 62
// rounds and 8 items left), so without a split the last round runs a few whole items on a few SMs
// while the others idle, ~1/63 of the kernel. Split into parts, the tail items spread over the
// whole grid; the combine entry merges the parts (sm90_combine.cuh).
template <class C>
MJ_DEVICE int unit_item(const SparsePrefillArgs& a, int u) {
  return u >= a.split_first ? a.split_first + ((u - a.split_first) >> a.split_shift) : u;
}
// Units of the walk (the host keeps this <= INT_MAX).
template <class C>
MJ_DEVICE int unit_count(const SparsePrefillArgs& a) {
  const int items = static_cast<int>(a.num_tokens) * C::kCtasPerToken;
  return a.split_first + ((items - a.split_first) << a.split_shift);
}
// Unit `u` (item unit_item(u): token item / kCtasPerToken, head tile item % kCtasPerToken) given its
// topk_lengths value. Item indices are 32-bit: the host keeps tokens * head tiles <= INT_MAX.
template <class C>
MJ_DEVICE CtaWork item_work(const SparsePrefillArgs& args, int u, u32 len) {
  const int it = unit_item<C>(args, u);
  CtaWork w;
  w.token = it / C::kCtasPerToken;
  w.head0 = (it % C::kCtasPerToken) * C::kHeadsPerCta;
  w.topk_len = static_cast<int>(static_cast<long long>(len) < args.indices_stride ? static_cast<long long>(len)
                                                                                   : args.indices_stride);
  w.steps = (w.topk_len + 2 * kBlockKeys - 1) / (2 * kBlockKeys);
  w.step0 = 0;
  w.first_slot = 0;
  w.slot = -1;
  if (args.split_shift > 0 && u >= args.split_first) {
    const int k = u - args.split_first, part = k & ((1 << args.split_shift) - 1);
    w.slot = k;
    if constexpr (C::kPersistent) {
      const int first = static_cast<int>((static_cast<i64>(part) * w.steps) >> args.split_shift);
      const int end = static_cast<int>((static_cast<i64>(part + 1) * w.steps) >> args.split_shift);
      w.step0 = first;
      w.first_slot = first * 2 * kBlockKeys;
      w.steps = end - first;
      // The part's slots end with its last step: the producer loads no index of the next part.
      w.topk_len = min(w.topk_len, end * 2 * kBlockKeys);
    } else {
      part_blocks(w, part, args.split_shift);
    }
  }
  return w;
}
// topk_lengths of unit `u`'s item (the persistent roles load the next unit's one unit ahead).
template <class C>
MJ_DEVICE u32 item_len(const SparsePrefillArgs& args, int u) {
  return __ldg(args.topk_lengths + unit_item<C>(args, u) / C::kCtasPerToken);
}
// The producer's first index loads wait for topk_lengths[token] (SPEC §3: slots past the length are
// never read), so at CTA start two DRAM round trips run back to back. Five lanes of the producer
// hint the row's first 160 slots (the first step's 128) into L2 while the length is in flight: a
// prefetch moves no value into the program, and the row is allocated up to its stride.
// (The CTA's first item: blockIdx.x, or with a tail split the item of unit blockIdx.x.)
template <class C>
MJ_DEVICE void hint_first_indices(const SparsePrefillArgs& args, i64 first_token, i64 first_slot = 0) {
  // On for the 16-bit kernels (bf16: -0.5 % cycles at 32K keys, -0.3 % at 8K, 0.0 at 128K), off for
  // FP8 math (+0.2 %).
  constexpr bool kIndexPrefetch = !C::kFp8Math;
  if constexpr (kIndexPrefetch) {
    const u32 pt = threadIdx.x - 256u;
    if (pt < 5u && first_slot + static_cast<i64>(32 * pt) < args.indices_stride) {
      const u32* row = args.indices + first_token * args.indices_stride + first_slot;
      asm volatile("prefetch.global.L2 [%0];" ::"l"(row + 32 * pt));
    }
  }
}
// One CTA per unit (the fp8 kernels): this CTA's unit blockIdx.x, an item or, with a split
// (args.split_shift > 0: the decode plan and the tail of a launch, ops/sparse_prefill/op.cpp
// tail_split), a part of one. The first indices hinted are those of a full-length row's part (the
// length is still in flight; a prefetch moves no value into the program).
// The crossover (Config::kCrossover, launched in clusters of 2): CTAs 2 v and 2 v + 1 are head tiles
// 0 and 1 of token unit v and take the same keys. Token units split as items do above, over tokens
// (the host gives split_first even: first / 2 tokens whole); a split token part's two CTAs write
// the slots of their items, (2 (k >> shift) + tile) << shift | part, the slot the combine reads for
// item split_first + 2 (k >> shift) + tile.
template <class C>
MJ_DEVICE CtaWork cta_work_crossover(const SparsePrefillArgs& args) {
  const int v = static_cast<int>(blockIdx.x) >> 1, tile = static_cast<int>(blockIdx.x) & 1;
  const int first = args.split_first >> 1;
  const bool split = args.split_shift > 0 && v >= first;
  const int k = v - first, mask = (1 << args.split_shift) - 1;
  const i64 token = split ? first + (k >> args.split_shift) : v;
  hint_first_indices<C>(args, token, split ? part_first_slot_hint(args, k & mask) : 0);
  const u32 len = __ldg(args.topk_lengths + token);
  CtaWork w;
  w.token = token;
  w.head0 = tile * C::kHeadsPerCta;
  w.topk_len = static_cast<int>(static_cast<long long>(len) < args.indices_stride ? static_cast<long long>(len)
                                                                                   : args.indices_stride);
  w.steps = (w.topk_len + 2 * kBlockKeys - 1) / (2 * kBlockKeys);
  w.step0 = 0;
  w.first_slot = 0;
  w.slot = -1;
  if (split) {
    const int part = k & mask;
    part_blocks(w, part, args.split_shift);
    w.slot = ((((k >> args.split_shift) << 1) + tile) << args.split_shift) | part;
  }
  return w;
}

template <class C>
MJ_DEVICE CtaWork cta_work(const SparsePrefillArgs& args) {
  if constexpr (C::kCrossover) return cta_work_crossover<C>(args);
  const int u = static_cast<int>(blockIdx.x);
  const int it = unit_item<C>(args, u);
  const i64 token = it / C::kCtasPerToken;
  i64 hint_slot = 0;
  if (args.split_shift > 0 && u >= args.split_first)
    hint_slot = part_first_slot_hint(args, (u - args.split_first) & ((1 << args.split_shift) - 1));
  hint_first_indices<C>(args, token, hint_slot);
  return item_work<C>(args, u, __ldg(args.topk_lengths + token));
}

// ---- the persistent walk (Config::kPersistent) --------------------------------------------------------
// Every role walks the same items: it = blockIdx.x, + gridDim.x, ... (a static stride: no counter to
// reset, so a launch can be replayed in a CUDA graph), with each item's topk length loaded one item
// ahead. `gs` counts the steps of the items before (the K ring's barrier parities run on), `n` the
// items (parities of q_full / q_free / rowsum_ready / rowsum_read).
template <class C>
MJ_DEVICE void produce_items(const SparsePrefillArgs& a, const Smem& s) {
  const int items = unit_count<C>(a), stride = static_cast<int>(gridDim.x);  // units (tail split)
  int it = static_cast<int>(blockIdx.x);
  if (it >= items) return;  // (the host launches at most one CTA per unit)
  hint_first_indices<C>(a, unit_item<C>(a, it) / C::kCtasPerToken);
  u32 len = item_len<C>(a, it);
  // L2 policies: gathered rows evict-last (re-read by other tokens' CTAs), the query evict-first
  // (read once). Created once, outside the item loop.
  const u64 policy = sm90::l2_policy_evict_last(), q_policy = sm90::l2_policy_evict_first();
  u32 gs = 0;  // steps of the items before (only its parity is used)
  for (u32 n = 0;; ++n) {
    const bool more = it < items - stride;  // (it + stride would overflow near INT_MAX)
    const u32 len_next = more ? item_len<C>(a, it + stride) : 0u;
    const CtaWork w = item_work<C>(a, it, len);
    produce_bf16<C>(a, s, w.token, w.head0, w.topk_len, w.step0, w.steps, gs, n, policy, q_policy);
    if (!more) break;
    gs += static_cast<u32>(w.steps);
    len = len_next;
    it += stride;
  }
  sm90::cp_async_wait_all();
}

template <class C, int WG>
MJ_DEVICE void consume_items(const SparsePrefillArgs& a, const Smem& s, const Lane& ln, int lane) {
  const int items = unit_count<C>(a), stride = static_cast<int>(gridDim.x);  // units (tail split)
  int it = static_cast<int>(blockIdx.x);
  if (it >= items) return;
  u32 len = item_len<C>(a, it);
  u32 gs = 0;
  for (u32 n = 0;; ++n) {
    const bool more = it < items - stride;
    const u32 len_next = more ? item_len<C>(a, it + stride) : 0u;
    const CtaWork w = item_work<C>(a, it, len);
    // The query tile landed by cp.async (the acquire-form proxy fence: no instruction, as wait_full).
    sm90::mbar_wait(s.q_full, n & 1u);
    sm90::fence_proxy_async_acquire_smem();
    if (w.steps == 0) sm90::mbar_arrive(s.q_free);  // else after the item's last Q K^T
    if constexpr (WG == 0) {
      consume_wg0<C>(a, s, ln, lane, w.token, w.head0, w.steps, 1.0f, gs, n, w.slot);
    } else {
      consume_wg1<C>(a, s, ln, lane, w.token, w.head0, w.steps, 1.0f, gs, n, w.slot);
    }
    if (!more) break;
    gs += static_cast<u32>(w.steps);
    len = len_next;
    it += stride;
  }
}

}  // namespace sparse_prefill_sm90
}  // namespace mj
