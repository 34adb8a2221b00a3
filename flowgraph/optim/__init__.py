"""``flowgraph.optim``: PyTorch's optimizers, learning-rate schedulers and ``GradScaler``.

    from flowgraph import optim
    opt = optim.Adam(model.parameters(), lr=1e-3)
    sched = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
    loss.backward(); opt.step(); opt.zero_grad(); sched.step()
"""

from . import lr_scheduler
from .adagrad import Adagrad
from .adam import Adam, AdamW
from .grad_scaler import GradScaler
from .nadam import NAdam
from .optimizer import Optimizer
from .radam import RAdam
from .rmsprop import RMSprop
from .sgd import SGD

__all__ = ["SGD", "Adagrad", "Adam", "AdamW", "GradScaler", "NAdam", "Optimizer", "RAdam", "RMSprop",
           "lr_scheduler"]
