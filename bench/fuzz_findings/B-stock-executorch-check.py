import torch, logging, warnings
logging.disable(logging.WARNING); warnings.filterwarnings("ignore")
import torch.nn.functional as F
from executorch.backends.arm.quantizer import VgfQuantizer, get_symmetric_quantization_config
from executorch.backends.arm.vgf import VgfCompileSpec, VgfPartitioner
from executorch.exir import to_edge_transform_and_lower
from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e, convert_pt2e
from etkit_exporter.vgf.tools import configure_model_converter
configure_model_converter()
class M(torch.nn.Module):
    def __init__(s):
        super().__init__(); torch.manual_seed(6); s.c = torch.nn.Conv2d(4, 4, 1)
    def forward(s, x):
        return (F.avg_pool2d(torch.sigmoid(s.c(x)), 2),)
x = torch.rand(1, 4, 6, 8) * 2 - 1
m = M().eval()
spec = VgfCompileSpec("TOSA-1.0+INT+FP+int16")
q = VgfQuantizer(spec); q.set_global(get_symmetric_quantization_config())
g = torch.export.export(m, (x,), strict=True).module(check_guards=False)
p = prepare_pt2e(g, q); p(x); c = convert_pt2e(p)
ep = torch.export.export(c, (x,), strict=True)
try:
    to_edge_transform_and_lower(ep, partitioner=[VgfPartitioner(spec)])
    print("STOCK OK")
except Exception as e:
    c = e
    while c.__cause__ or c.__context__: c = c.__cause__ or c.__context__
    print("STOCK ERR", type(c).__name__, str(c)[:400])
