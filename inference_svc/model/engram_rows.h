// Engram rows read on the host from the mapped GGUF (ARCHITECTURE.md, "Engram row reader").
// The real model's two tables are ~80 GB at Q2_K, more than the device memory left beside the
// expert arena, and a token needs only 2 x 24 rows of them: the rows a call needs are asked of
// the kernel all at once (their page-ins then run in parallel, while the step computes), and
// copied into a staging buffer in the call's order when the layer needs them. The page cache
// is the row cache: rows are Zipfian (peers-perf.md §2.4), hot ones stay in memory.
#pragma once

#include <cstdint>

#include "kernels/linear/linear.h"

namespace dsflash::model {

// Starts reading the pages of rows ids[0..n) of `table` (a view into a mapped file) without
// waiting for them. Ids must be valid rows.
void prefetch_rows(const kernels::Weight& table, const int64_t* ids, int64_t n);

// Copies rows ids[0..n) of `table` to dst (n * table.row_bytes bytes) in the order given.
void copy_rows(const kernels::Weight& table, const int64_t* ids, int64_t n, uint8_t* dst);

}  // namespace dsflash::model
