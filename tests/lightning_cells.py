"""A tiny LightningModule and `fit(**trainer_kwargs) -> (view, params)`, as cell source: run on the ranks by
tests/integration/test_fw_lightning.py and test_slurm_frameworks.py. `view` is the Trainer's own view of
the rank (global rank, node rank, local rank, world size, steps, cluster environment's class)."""

from __future__ import annotations

import textwrap

LIGHTNING_FIT = textwrap.dedent(
    """
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    import lightning as L

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)
        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def data(seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(32, 4, generator=g)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)

    def fit(**kw):
        torch.manual_seed(0)
        model = Tiny()
        trainer = L.Trainer(accelerator="cpu", strategy="ddp", max_steps=3, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, **kw)
        trainer.fit(model, data(trainer.global_rank))
        view = (trainer.global_rank, trainer.node_rank, trainer.local_rank, trainer.world_size, trainer.global_step,
                type(trainer.strategy.cluster_environment).__name__)
        return view, torch.cat([p.detach().flatten() for p in model.parameters()])
    """
)
