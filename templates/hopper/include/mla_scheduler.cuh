// The split scheduler: cuts the batch's KV into near-equal parts, one part per group of
// SMs, on the GPU (no host sync, so it is CUDA-graph safe and shared by all layers).
//
// Cost of a request = its 64-token blocks + a fixed overhead (the cost of one more split:
// loading Q, writing a partial result, combining it).  Each part gets
//     payload = ceil(total cost / parts) + overhead
// and takes requests in order: a whole request when the rest of it fits, else a prefix of
// (budget - overhead) blocks, which makes one more split of that request.
//
// Metadata of part p (8 ints):
//   [0] first request   [1] first token of the first request (a multiple of 64)
//   [2] last request    [3] end token (exclusive) of the last request
//   [4] split index, within the first request, of the part's first piece
//   [5..7] unused (0)
// A part with [0] > [2] is empty.  num_splits[i] = splits of requests < i, so the slot of a
// piece is num_splits[req] + (req == first request ? [4] : 0); a request with one split
// writes its output directly and the combine kernel skips it.
//
// plan_splits is plain C++ so the same code runs on the host (tests, compiled with g++).
#pragma once

#ifdef __CUDACC__
#define MLAGEN_HD __host__ __device__
#else
#define MLAGEN_HD
#endif

namespace mlagen {
namespace hopper {

MLAGEN_HD inline int sched_blocks(int seqlen) { return seqlen > 0 ? (seqlen + 63) / 64 : 0; }

// nblk[i]: 64-token blocks of request i.  Writes sched[parts*8] and num_splits[batch+1].
MLAGEN_HD inline void plan_splits(const int* nblk, int batch, int parts, int fixed_cost,
                                  int* sched, int* num_splits) {
  long long total = 0;
  for (int i = 0; i < batch; ++i) total += nblk[i] + fixed_cost;
  const long long payload = (total + parts - 1) / parts + fixed_cost;
  int req = 0, blk = 0, piece = 0, cum = 0;
  num_splits[0] = 0;
  for (int p = 0; p < parts; ++p) {
    int* md = sched + p * 8;
    md[0] = req;
    md[1] = blk * 64;
    md[4] = piece;
    md[5] = md[6] = md[7] = 0;
    long long budget = payload;
    while (req < batch) {
      const long long rest = nblk[req] - blk;
      if (budget >= rest + fixed_cost) {          // the rest of this request fits
        cum += piece + 1;
        num_splits[req + 1] = cum;
        budget -= rest + fixed_cost;
        ++req;
        blk = 0;
        piece = 0;
      } else {
        if (budget > fixed_cost) {                // a prefix of it, as one more split
          blk += static_cast<int>(budget - fixed_cost);
          ++piece;
        }
        break;
      }
    }
    if (blk > 0) {
      md[2] = req;
      md[3] = blk * 64;
    } else {
      md[2] = req - 1;
      md[3] = req > 0 ? nblk[req - 1] * 64 : 0;
    }
  }
}

// A fixed split (schedule split_kv = N): part r * N + i is the i-th of N near-equal pieces
// of request r (a piece may be empty); parts = batch * N.
MLAGEN_HD inline void plan_fixed_splits(const int* nblk, int batch, int n, int* sched,
                                        int* num_splits) {
  num_splits[0] = 0;
  for (int r = 0; r < batch; ++r) {
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
      md[5] = md[6] = md[7] = 0;
    }
    num_splits[r + 1] = (r + 1) * n;
  }
}

}  // namespace hopper
}  // namespace mlagen
