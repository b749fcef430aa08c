// The split scheduler: cuts the batch's KV into near-equal parts, one part per group of
// SMs, on the GPU (no host sync, so it is CUDA-graph safe and shared by all layers).
//
// Cost of a request = a fixed overhead F (what one more split costs: loading Q, writing a
// partial result, combining it) followed by its 64-token blocks.  Laid end to end the
// requests form a line of `total` cost units; request r starts at cum[r] (an exclusive
// prefix sum) and its block j sits at position cum[r] + F + j.  Part p owns the positions
// [p * P, (p + 1) * P) with P = ceil(total / parts), so each part is a closed-form function
// of the prefix sums: a GPU thread per part finds its requests with two binary searches
// (no thread walks the parts one after another).
//
//   first part of request r   (cum[r] + F) / P              (cum[r] / P when it has no block)
//   last part of request r    (cum[r] + F + nblk[r] - 1) / P (= its first when no block)
//   splits of request r       last - first + 1
//
// Both are non-decreasing in r, so the requests of part p are the range
// [first r with last(r) >= p, last r with first(r) <= p].
//
// Metadata of part p (8 ints):
//   [0] first request   [1] first token of the first request (a multiple of 64)
//   [2] last request    [3] end token (exclusive) of the last request
//   [4] split index, within the first request, of the part's first piece
//   [5] the cluster plan's merge: c when the part's one piece merges with the other c - 1
//       pieces of its request through the cluster's shared memory (below), else 0
//   [6..7] unused (0)
// A part with [0] > [2] is empty.  num_splits[i] = splits of requests < i, so the slot of a
// piece is num_splits[req] + (req == first request ? [4] : 0); a request with one split
// writes its output directly and the combine kernel skips it.
//
// Equal pieces instead (the equal plan, batch <= parts): every request in pieces of at most
// L blocks (at least one piece, the last shorter), one piece a part, L the smallest for
// which they fit, when L is at most one split (F) more than the payload.  The balanced plan
// gives a part one piece or two (the end of a request and the start of the next), and each
// piece costs a Q load and an epilogue more than the model's F counts once per request: a
// b = 32 batch of 1024 tokens over 66 parts ran its split kernel 2.2 us slower than 2 equal
// pieces each (5569878:benchmarks/results/split_probe_h200_959010e.json, "fixed").  Hence one F of
// slack on L (the chunk plan below allows one F on a chunk's cost): b = 128 of 16384 tokens
// over 132 parts is pieces of 256 blocks against a payload of 254, which the balanced plan
// split into 257 pieces and a combine to gain 2 blocks a part (1.05-1.06x whole).
//
// Whole requests instead (the chunk plan): part p takes the k = ceil(batch / parts)
// requests [p k, p k + k), none split, each written directly, when the fullest such part
// costs at most one split (F) more than the payload.  For near-equal requests the balanced
// plan splits nearly every request (b = 128 of 8192 tokens over 132 parts: 127) to gain
// less than that: two pieces a part, each loading Q, each writing an fp32 partial that the
// combine reads back (whole requests measured 1.02-1.18x faster on the bench's fixed-length
// rows where this rule picks them: 5569878:benchmarks/results/hopper_plan_h200.md).
//
// The cluster plan (a split kernel launched in clusters of c CTAs along the parts, c > 1:
// sched_cluster): part r c + i is the i-th of c near-equal pieces of request r, and the c
// CTAs of a cluster merge their pieces through distributed shared memory and write the
// output themselves (no partials, nothing for the combine: num_splits counts one split a
// request).  Taken in place of the equal plan when its longest piece, ceil(n / c) blocks, is
// no longer than the equal plan's: with near-equal requests (b = 32 of 1024 tokens over 66
// parts: 2 pieces of 8 blocks either way) the split then costs no partial bytes and no
// combine; with unequal ones the equal plan keeps its balance.
//
// The per-part and per-request functions are plain C++ so the same code runs on the host
// (tests compile this header with g++ and compare with mlagen/backends/hopper/scheduler.py).
#pragma once

#ifdef __CUDACC__
#define MLAGEN_HD __host__ __device__
#else
#define MLAGEN_HD
#endif

namespace mlagen {
namespace hopper {

MLAGEN_HD inline int sched_blocks(int seqlen) { return seqlen > 0 ? (seqlen + 63) / 64 : 0; }

// Cost units per part, from the total cost (>= 1).
MLAGEN_HD inline long long sched_payload(long long total, int parts) {
  const long long p = (total + parts - 1) / parts;
  return p > 0 ? p : 1;
}

MLAGEN_HD inline int sched_first_part(const long long* cum, const int* nblk, int r,
                                      long long payload, int fixed_cost) {
  return static_cast<int>((nblk[r] > 0 ? cum[r] + fixed_cost : cum[r]) / payload);
}

MLAGEN_HD inline int sched_last_part(const long long* cum, const int* nblk, int r,
                                     long long payload, int fixed_cost) {
  return nblk[r] > 0 ? static_cast<int>((cum[r] + fixed_cost + nblk[r] - 1) / payload)
                     : static_cast<int>(cum[r] / payload);
}

MLAGEN_HD inline int sched_splits(const long long* cum, const int* nblk, int r,
                                  long long payload, int fixed_cost) {
  return sched_last_part(cum, nblk, r, payload, fixed_cost) -
         sched_first_part(cum, nblk, r, payload, fixed_cost) + 1;
}

// The 8 metadata ints of part p (cum has batch + 1 entries).
MLAGEN_HD inline void plan_part(const long long* cum, const int* nblk, int batch, int p,
                                long long payload, int fixed_cost, int* md) {
  // lo = first request whose last part is >= p
  int lo = 0, hi = batch;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (sched_last_part(cum, nblk, mid, payload, fixed_cost) >= p) hi = mid; else lo = mid + 1;
  }
  const int r0 = lo;
  // r1 = last request whose first part is <= p
  lo = 0;
  hi = batch;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (sched_first_part(cum, nblk, mid, payload, fixed_cost) > p) hi = mid; else lo = mid + 1;
  }
  const int r1 = lo - 1;
  md[5] = md[6] = md[7] = 0;
  if (r0 > r1) {                       // nothing of any request falls in this part
    md[0] = r0;
    md[1] = 0;
    md[2] = r0 - 1;
    md[3] = 0;
    md[4] = 0;
    return;
  }
  const int f0 = sched_first_part(cum, nblk, r0, payload, fixed_cost);
  md[0] = r0;
  md[1] = f0 == p ? 0 : static_cast<int>(p * payload - cum[r0] - fixed_cost) * 64;
  md[2] = r1;
  md[3] = sched_last_part(cum, nblk, r1, payload, fixed_cost) == p
              ? nblk[r1] * 64
              : static_cast<int>((p + 1) * payload - cum[r1] - fixed_cost) * 64;
  md[4] = p - f0;
}

// The chunk plan: first request of part p's chunk (batch once past the last).
MLAGEN_HD inline int sched_chunk_start(int batch, int k, int p) {
  const long long r = static_cast<long long>(p) * k;
  return r < batch ? static_cast<int>(r) : batch;
}

// Whether part p's chunk costs more than the balanced plan's payload plus one split (cum:
// the prefix sums of nblk + F), which rules the chunk plan out.
MLAGEN_HD inline bool sched_chunk_too_big(const long long* cum, int batch, int k, int p,
                                          long long payload, int fixed_cost) {
  const long long load =
      cum[sched_chunk_start(batch, k, p + 1)] - cum[sched_chunk_start(batch, k, p)];
  return load > payload + fixed_cost;
}

// The 8 metadata ints of part p in the chunk plan (num_splits[r] = r).
MLAGEN_HD inline void plan_chunk_part(const int* nblk, int batch, int k, int p, int* md) {
  const int r0 = sched_chunk_start(batch, k, p), r1 = sched_chunk_start(batch, k, p + 1) - 1;
  md[0] = r0;
  md[1] = 0;
  md[2] = r1;
  md[3] = r1 >= r0 ? nblk[r1] * 64 : 0;
  md[4] = md[5] = md[6] = md[7] = 0;
}

// The equal plan: pieces of request r at `piece` blocks each (at least one).
MLAGEN_HD inline int sched_pieces(int nblk, int piece) {
  const int s = (nblk + piece - 1) / piece;
  return s > 1 ? s : 1;
}

// The metadata of request r's pieces, on parts first, first + 1, ...
MLAGEN_HD inline void plan_equal_request(const int* nblk, int r, long long first, int piece,
                                         int* sched) {
  const int s = sched_pieces(nblk[r], piece);
  for (int i = 0; i < s; ++i) {
    int* md = sched + (first + i) * 8;
    const int end = (i + 1) * piece < nblk[r] ? (i + 1) * piece : nblk[r];
    md[0] = r;
    md[1] = i * piece * 64;
    md[2] = r;
    md[3] = end * 64;
    md[4] = i;
    md[5] = md[6] = md[7] = 0;
  }
}

// A part with nothing to do.
MLAGEN_HD inline void plan_empty_part(int batch, int* md) {
  md[0] = batch;
  md[1] = 0;
  md[2] = batch - 1;
  md[3] = md[4] = md[5] = md[6] = md[7] = 0;
}

// A fixed split (schedule split_kv = N): part r * N + i is the i-th of N near-equal pieces
// of request r (a piece may be empty); parts = batch * N.  merge: md[5] (the cluster plan's c).
MLAGEN_HD inline void plan_fixed_request(const int* nblk, int r, int n, int* sched,
                                         int merge = 0) {
  const int per = (nblk[r] + n - 1) / n;
  for (int i = 0; i < n; ++i) {
    int* md = sched + (r * n + i) * 8;
    const int b0 = per * i < nblk[r] ? per * i : nblk[r];
    const int b1 = per * (i + 1) < nblk[r] ? per * (i + 1) : nblk[r];
    md[0] = r;
    md[1] = b0 * 64;
    md[2] = r;
    md[3] = b1 * 64;
    md[4] = i;
    md[5] = merge;
    md[6] = md[7] = 0;
  }
}

// The cluster size of a split kernel that can merge in clusters of up to max_c CTAs, for
// `batch` requests over `parts` parts: the largest c (a power of 2) that divides the parts,
// gives every request c parts, leaves fewer than c more parts a request (else the equal
// plan has pieces shorter than a c-th of a request and the cluster plan is never taken:
// the cluster launch alone costs 1-2 us), and whose clusters the device holds at once
// (max_resident[c] >= parts / c; -1 for "not asked"), else 1 (no clusters).
MLAGEN_HD inline int sched_cluster(int batch, int parts, int max_c, const int* max_resident) {
  for (int c = max_c; c > 1; c /= 2)
    if (parts % c == 0 && static_cast<long long>(batch) * c <= parts &&
        static_cast<long long>(batch) * 2 * c > parts &&
        (max_resident == nullptr || max_resident[c] < 0 || max_resident[c] * c >= parts))
      return c;
  return 1;
}

// Whether the cluster plan replaces the equal plan of pieces of `piece` blocks: its pieces
// (ceil(n / c) blocks) are no longer, for the longest request `top`.
MLAGEN_HD inline bool sched_cluster_fits(int batch, int parts, int cluster, int top,
                                         int piece) {
  return cluster > 1 && static_cast<long long>(batch) * cluster <= parts &&
         (top + cluster - 1) / cluster <= piece;
}

// The whole plan, sequentially (the host's version; the GPU kernel computes the same prefix
// sums in parallel and calls plan_part once per thread).  cum: batch + 1 scratch entries.
MLAGEN_HD inline void plan_splits(const int* nblk, int batch, int parts, int fixed_cost,
                                  long long* cum, int* sched, int* num_splits,
                                  int cluster = 1) {
  cum[0] = 0;
  for (int i = 0; i < batch; ++i) cum[i + 1] = cum[i] + nblk[i] + fixed_cost;
  const long long payload = sched_payload(cum[batch], parts);
  num_splits[0] = 0;
  if (batch <= parts) {   // the equal plan: the smallest piece that fits, by bisection
    int lo = 1, hi = 1;
    for (int r = 0; r < batch; ++r) hi = nblk[r] > hi ? nblk[r] : hi;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      long long n = 0;
      for (int r = 0; r < batch; ++r) n += sched_pieces(nblk[r], mid);
      if (n <= parts) hi = mid; else lo = mid + 1;
    }
    if (lo <= payload + fixed_cost) {
      int top = 0;
      for (int r = 0; r < batch; ++r) top = nblk[r] > top ? nblk[r] : top;
      if (sched_cluster_fits(batch, parts, cluster, top, lo)) {
        for (int r = 0; r < batch; ++r) {
          plan_fixed_request(nblk, r, cluster, sched, cluster);
          num_splits[r + 1] = r + 1;
        }
        for (int p = batch * cluster; p < parts; ++p) plan_empty_part(batch, sched + p * 8);
        return;
      }
      for (int r = 0; r < batch; ++r) num_splits[r + 1] = num_splits[r] + sched_pieces(nblk[r], lo);
      for (int p = num_splits[batch]; p < parts; ++p) plan_empty_part(batch, sched + p * 8);
      for (int r = 0; r < batch; ++r) plan_equal_request(nblk, r, num_splits[r], lo, sched);
      return;
    }
  }
  const int k = (batch + parts - 1) / parts;
  bool too_big = false;
  for (int p = 0; p < parts; ++p)
    too_big = too_big || sched_chunk_too_big(cum, batch, k, p, payload, fixed_cost);
  if (!too_big) {
    for (int r = 0; r < batch; ++r) num_splits[r + 1] = r + 1;
    for (int p = 0; p < parts; ++p) plan_chunk_part(nblk, batch, k, p, sched + p * 8);
    return;
  }
  for (int r = 0; r < batch; ++r)
    num_splits[r + 1] = num_splits[r] + sched_splits(cum, nblk, r, payload, fixed_cost);
  for (int p = 0; p < parts; ++p) plan_part(cum, nblk, batch, p, payload, fixed_cost, sched + p * 8);
}

MLAGEN_HD inline void plan_fixed_splits(const int* nblk, int batch, int n, int* sched,
                                        int* num_splits) {
  num_splits[0] = 0;
  for (int r = 0; r < batch; ++r) {
    plan_fixed_request(nblk, r, n, sched);
    num_splits[r + 1] = (r + 1) * n;
  }
}

}  // namespace hopper
}  // namespace mlagen
