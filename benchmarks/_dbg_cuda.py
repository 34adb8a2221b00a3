import flowgraph as fg, numpy as np
device = "cuda"
w = fg.tensor([1.0, 2.0], device=device, requires_grad=True)
@fg.jit
def step(x):
    w.grad = None
    loss = (w * x).sum()
    loss.backward()
    with fg.no_grad():
        w.sub_(w.grad * 0.5)
    return loss
x = fg.tensor([1.0, 1.0], device=device)
for i in range(4):
    l = step(x)
    print(i, l.item(), w.detach().numpy(), w.grad.numpy(), id(w.grad), id(w.grad._data), w.grad._data.data.ptr, w._data.data.ptr)
