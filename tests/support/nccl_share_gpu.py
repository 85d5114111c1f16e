"""Two ranks on one GPU with NCCL (``torchrun --nproc-per-node=2 nccl_share_gpu.py``): a bare
all-reduce, printing its sum; where NCCL refuses two ranks on one device, it fails with NCCL's reason."""

import torch
import torch.distributed as dist

torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
value = torch.tensor([float(dist.get_rank() + 1)], device="cuda")
dist.all_reduce(value)
torch.cuda.synchronize()
print(f"rank {dist.get_rank()}: all_reduce gave {value.item()}", flush=True)
dist.destroy_process_group()
