"""Where a training step of the CIFAR models spends its time: torch.profiler's top operators.

python -m benchmarks.profile_cifar_step --device cuda --batch 100 --model sa-quadratic
"""

from __future__ import annotations

import argparse

import torch
from torch.nn import functional as F  # noqa: N812

from structconv.experiments.cifar.models import SelfAttentionNet, build_model
from structconv.experiments.cifar.reference import dense_twin


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--model", default="sa-quadratic")
    parser.add_argument("--dense", action="store_true", help="profile the paper-dense twin instead")
    parser.add_argument("--rows", type=int, default=25)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = build_model(args.model).to(args.device)
    if args.dense:
        assert isinstance(model, SelfAttentionNet)
        model = dense_twin(model)
    cuda = args.device.startswith("cuda")
    x = torch.randn(args.batch, 3, 32, 32, device=args.device)
    y = torch.randint(0, 10, (args.batch,), device=args.device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step() -> None:
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = F.cross_entropy(model(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(5):
            step()
        if cuda:
            torch.cuda.synchronize()
    key = "cuda_time_total" if cuda else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=args.rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
