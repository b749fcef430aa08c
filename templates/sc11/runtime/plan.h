// Phase B work split over the cores (the multi-core schemes), chosen at run time.
//   heads     each core its heads, every sequence whole (the KV is read once per core)
//   batch     each core whole sequences, longest first onto the least-loaded core
//   seq       each core one slice of every sequence; slices merged by their lse
//   batch_seq sequences cut into pieces of about total/cores tokens, pieces balanced like
//             batch; a sequence cut in several pieces is merged like seq
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace sc11 {

enum Scheme : int { SCHEME_HEADS = 1, SCHEME_BATCH = 2, SCHEME_SEQ = 3, SCHEME_BATCH_SEQ = 4 };

struct Piece {
  int seq;          // sequence (batch index)
  int64_t t0, t1;   // key range [t0, t1) of the sequence
  int h0, h1;       // head range
  int part;         // index of its partial result in L2, -1 when it writes the output
};

struct Plan {
  std::vector<std::vector<Piece>> per_core;
  std::vector<std::vector<int>> parts_of_seq;   // per sequence: its partials (empty: none)
  std::vector<std::vector<int>> merge_per_core; // sequences each core merges
  int n_parts = 0;
};

// Split [0, len) into n slices aligned to `align`, dropping empty ones.
inline std::vector<std::pair<int64_t, int64_t>> slices(int64_t len, int n, int64_t align) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (len <= 0 || n <= 1) {
    out.push_back({0, std::max<int64_t>(len, 0)});
    return out;
  }
  int64_t chunk = (len + n - 1) / n;
  chunk = (chunk + align - 1) / align * align;
  for (int64_t t = 0; t < len; t += chunk) out.push_back({t, std::min(len, t + chunk)});
  return out;
}

// kv_len[b]: keys of sequence b the kernel reads; heads: heads per card.
inline Plan make_plan(int scheme, const std::vector<int64_t>& kv_len, int heads, int cores,
                      int heads_per_core, int64_t align) {
  const int B = (int)kv_len.size();
  Plan p;
  p.per_core.assign(cores, {});
  p.parts_of_seq.assign(B, {});
  p.merge_per_core.assign(cores, {});
  const int64_t overhead = align;  // a piece costs at least one block of work

  // pieces of every sequence (before assignment), for batch / seq / batch_seq
  std::vector<std::vector<std::pair<int64_t, int64_t>>> cut(B);
  if (scheme == SCHEME_HEADS) {
    for (int c = 0; c < cores; ++c) {
      const int h0 = c * heads_per_core, h1 = std::min(heads, h0 + heads_per_core);
      if (h0 >= h1) continue;
      for (int b = 0; b < B; ++b) p.per_core[c].push_back({b, 0, kv_len[b], h0, h1, -1});
    }
    return p;
  }
  if (scheme == SCHEME_BATCH) {
    for (int b = 0; b < B; ++b) cut[b] = slices(kv_len[b], 1, align);
  } else if (scheme == SCHEME_SEQ) {
    for (int b = 0; b < B; ++b) cut[b] = slices(kv_len[b], cores, align);
  } else {  // batch_seq
    int64_t total = 0;
    for (int b = 0; b < B; ++b) total += std::max<int64_t>(kv_len[b], 1) + overhead;
    const int64_t target = std::max<int64_t>(align, (total + cores - 1) / cores);
    for (int b = 0; b < B; ++b) {
      const int n = (int)std::min<int64_t>(cores, std::max<int64_t>(1, (kv_len[b] + target - 1) / target));
      cut[b] = slices(kv_len[b], n, align);
    }
  }
  struct Item { int seq; int64_t t0, t1; int part; };
  std::vector<Item> items;
  for (int b = 0; b < B; ++b) {
    const bool split = cut[b].size() > 1;
    for (size_t i = 0; i < cut[b].size(); ++i) {
      int part = -1;
      if (split) {
        part = p.n_parts++;
        p.parts_of_seq[b].push_back(part);
      }
      items.push_back({b, cut[b][i].first, cut[b][i].second, part});
    }
  }
  if (scheme == SCHEME_SEQ) {  // slice i of every sequence on core i
    for (int b = 0, k = 0; b < B; ++b)
      for (size_t i = 0; i < cut[b].size(); ++i, ++k) {
        const Item& it = items[k];
        p.per_core[i % cores].push_back({it.seq, it.t0, it.t1, 0, heads, it.part});
      }
  } else {  // longest processing time first onto the least-loaded core (ties: lower core)
    std::vector<int> order(items.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return items[a].t1 - items[a].t0 > items[b].t1 - items[b].t0;
    });
    std::vector<int64_t> load(cores, 0);
    std::vector<std::vector<int>> mine(cores);
    for (int i : order) {
      const int c = (int)(std::min_element(load.begin(), load.end()) - load.begin());
      load[c] += items[i].t1 - items[i].t0 + overhead;
      mine[c].push_back(i);
    }
    for (int c = 0; c < cores; ++c) {
      std::sort(mine[c].begin(), mine[c].end());  // sequence order within a core
      for (int i : mine[c])
        p.per_core[c].push_back({items[i].seq, items[i].t0, items[i].t1, 0, heads, items[i].part});
    }
  }
  int k = 0;
  for (int b = 0; b < B; ++b)
    if (!p.parts_of_seq[b].empty()) p.merge_per_core[k++ % cores].push_back(b);
  return p;
}

}  // namespace sc11
