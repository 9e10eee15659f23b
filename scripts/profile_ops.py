"""Per-op GPU time of one decode token (CUDA events per launch), summed by site. GPU only."""
import sys

from ds4lab.backends import make_backend
from ds4lab.bench import per_op_times
from ds4lab.config import get_preset
from ds4lab.model import DecodeModel, TokenOptions

preset = sys.argv[1] if len(sys.argv) > 1 else "ds4-flash"
be = make_backend("cupy")
be.compile_all()
m = DecodeModel(get_preset(preset), be, TokenOptions(vocab=True))
m.token(999, 3)
df = per_op_times(be, m)
out = sys.argv[2] if len(sys.argv) > 2 else None
if out:
    df.to_csv(out, index=False)
print(f"{preset}: GPU-busy sum {df.us.sum():.1f} us over {len(df)} launches")
print(df.groupby(["cluster", "site", "kernel"]).us.agg(["sum", "median", "count"]).sort_values("sum", ascending=False).to_string())
