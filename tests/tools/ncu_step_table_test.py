#!/usr/bin/env python3
"""scripts/ncu_step_table.py on a sample of a real ncu CSV (H200, one decode step, trimmed)."""
import csv
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(ROOT, "scripts", "ncu_step_table.py")
SAMPLE = os.path.join(ROOT, "tests", "data", "ncu_step_sample.csv")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import ncu_step_table  # noqa: E402


class NcuStepTable(unittest.TestCase):
    def test_short_names(self):
        f = ncu_step_table.short_name
        self.assertEqual(f("void dsflash::<unnamed>::gemv_kernel<12, 1, 4>(dsflash::kernels::LinearParams)"),
                         "gemv_kernel<12,1,4>")
        self.assertEqual(f("hc::<unnamed>::finish_split_kernel(const float *, int)"), "hc::finish_split_kernel")
        self.assertEqual(f("void f<(dsflash::quant::GgmlType)12>(int)"), "f<(quant::GgmlType)12>")

    def test_sample_grouped_by_name_and_grid(self):
        kernels = ncu_step_table.read_kernels(SAMPLE)
        self.assertEqual(len(kernels), 15)
        rows = ncu_step_table.table(kernels)
        self.assertEqual(len(rows), 14)  # the two mixes_partial launches share a row
        mixes = [r for r in rows if r[0] == "hc::mixes_partial_kernel"]
        self.assertEqual(len(mixes), 1)
        self.assertEqual(mixes[0][2], 2)
        self.assertEqual(rows[0][:2], ("q4k_mma_kernel<8>", "320x1x1"))  # longest first
        self.assertAlmostEqual(rows[0][3], 16.608, places=3)  # ns in the file, us here
        self.assertTrue(all(a[3] >= b[3] for a, b in zip(rows, rows[1:])))

    def test_rows_appended_as_eight_fields(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "results.csv")
            run = subprocess.run([sys.executable, SCRIPT, SAMPLE, "--csv", out, "--commit", "abc1234",
                                  "--machine", "H200 (16 threads, x86_64)", "--label", "perf prompt=64, decode=4"],
                                 capture_output=True, text=True, check=True)
            self.assertIn("15 kernels", run.stdout)
            with open(out, newline="") as f:
                rows = list(csv.reader(f))
            self.assertEqual(len(rows), 15)  # the total and 14 kernels
            for r in rows:
                self.assertEqual(len(r), 8, r)
                self.assertEqual(r[1:4], ["abc1234", "H200 (16 threads, x86_64)", "decode_step_ncu"])
            self.assertEqual(rows[0][5], "kernels_total_ms")
            self.assertEqual(rows[1][5], "kernel_q4k_mma_kernel<8>_grid320x1x1_us")

    def test_bad_input_is_a_clear_error(self):
        with tempfile.TemporaryDirectory() as d:
            bad = os.path.join(d, "bad.csv")
            with open(bad, "w") as f:
                f.write("a,b,c\n1,2,3\n")
            run = subprocess.run([sys.executable, SCRIPT, bad], capture_output=True, text=True)
            self.assertEqual(run.returncode, 1)
            self.assertIn("no 'Kernel Name' column", run.stderr)


if __name__ == "__main__":
    unittest.main()
