"""Linear regression held at a fixed distance from its optimum: a plain training script, no gpuwise in it.

x ~ N(0, I_d), y = x.w* + eps, eps ~ N(0, sigma^2), loss = mean over the batch of (x.w - y)^2 (MSELoss).
Per sample (dropping MSE's constant factor 2, which B_simple does not see): g = x (x.delta - eps),
delta = w - w*, so G = E[x x^T] delta = delta and, for Gaussian x, E[g g^T] = |delta|^2 I + 2 delta delta^T
+ sigma^2 I, hence tr(Sigma) = tr E[g g^T] - |G|^2 = (d + 1)|delta|^2 + d sigma^2 and

    B_simple = tr(Sigma) / |G|^2 = d (1 + sigma^2 / |delta|^2) + 1.

The learning rate is tiny so that w stays at that distance (|delta| changes < 1% over the run).
Usage: python linreg_noise.py D SIGMA BATCH STEPS
"""

import sys

import torch

d, sigma, batch, steps = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
torch.set_num_threads(1)
n = batch * steps
w_star = torch.randn(d)
x = torch.randn(n, d)
y = x @ w_star + sigma * torch.randn(n)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch, shuffle=True,
                                     drop_last=True)
model = torch.nn.Linear(d, 1, bias=False)
with torch.no_grad():
    delta = torch.randn(d)
    model.weight.copy_(w_star + delta / delta.norm())  # |delta| = 1
opt = torch.optim.SGD(model.parameters(), lr=2e-6)
for xb, yb in loader:
    loss = torch.nn.functional.mse_loss(model(xb).squeeze(1), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("distance", float((model.weight.detach()[0] - w_star).norm()))
