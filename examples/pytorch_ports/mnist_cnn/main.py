"""flowgraph port of ``main_torch.py`` (the PyTorch reference beside it): the convolutional network of
pytorch/examples' ``mnist/main.py`` (BSD-3-Clause licence) on synthetic MNIST-shaped data.

The code is the reference's with the renames listed in ``examples/pytorch_ports/README.md`` and nothing else
(``import torch`` -> ``import flowgraph as fg``, ``torch.`` -> ``fg.``, the ``nn``, ``F``, ``optim`` and
``StepLR`` imports); a test checks that, and that both train to the same losses from the same weights and
batches.

    python examples/pytorch_ports/mnist_cnn/main.py --epochs 2 --device cpu
"""

# ruff: noqa: UP008, UP032 - super(Net, self) and str.format kept as pytorch/examples writes them
import argparse

import numpy as np

import flowgraph as fg
import flowgraph.nn.functional as F
from flowgraph import nn, optim
from flowgraph.optim.lr_scheduler import StepLR


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = fg.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def synthetic_mnist(n, seed):
    """``n`` MNIST-shaped images (float32, (n, 1, 28, 28), normalised with MNIST's mean and std) and labels
    (int64): ten fixed random stroke templates, one per class, plus pixel noise."""
    templates = np.random.default_rng(12345).random((10, 1, 28, 28)) > 0.8
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=n)
    images = templates[labels] * 0.8 + rng.random((n, 1, 28, 28)) * 0.3
    return ((images - 0.1307) / 0.3081).astype(np.float32), labels.astype(np.int64)


class NumpyLoader:
    """A minimal stand-in for ``DataLoader``: batches of NumPy arrays as tensors, reshuffled every epoch."""

    def __init__(self, images, labels, batch_size, shuffle=False, seed=0):
        self.dataset = images
        self.images, self.labels, self.batch_size, self.shuffle = images, labels, batch_size, shuffle
        self.rng = np.random.default_rng(seed)

    def __len__(self):
        return (len(self.images) + self.batch_size - 1) // self.batch_size

    def __iter__(self):
        order = self.rng.permutation(len(self.images)) if self.shuffle else np.arange(len(self.images))
        for i in range(0, len(order), self.batch_size):
            idx = order[i:i + self.batch_size]
            yield fg.from_numpy(self.images[idx]), fg.from_numpy(self.labels[idx])


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    losses = []
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if batch_idx % args.log_interval == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100. * batch_idx / len(train_loader), loss.item()))
            if args.dry_run:
                break
    return losses


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with fg.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)  # get the index of the max log-probability
            correct += pred.eq(target.view(pred.shape)).sum().item()

    test_loss /= len(test_loader.dataset)

    print('\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n'.format(
        test_loss, correct, len(test_loader.dataset),
        100. * correct / len(test_loader.dataset)))
    return test_loss, correct


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='MNIST-shaped CNN example')
    parser.add_argument('--batch-size', type=int, default=64, metavar='N',
                        help='input batch size for training (default: 64)')
    parser.add_argument('--test-batch-size', type=int, default=256, metavar='N',
                        help='input batch size for testing (default: 256)')
    parser.add_argument('--epochs', type=int, default=2, metavar='N',
                        help='number of epochs to train (default: 2)')
    parser.add_argument('--train-size', type=int, default=1024, metavar='N',
                        help='number of synthetic training images (default: 1024)')
    parser.add_argument('--lr', type=float, default=0.01, metavar='LR',
                        help='learning rate (default: 0.01)')
    parser.add_argument('--momentum', type=float, default=0.5, metavar='M',
                        help='SGD momentum (default: 0.5)')
    parser.add_argument('--gamma', type=float, default=0.7, metavar='M',
                        help='Learning rate step gamma (default: 0.7)')
    parser.add_argument('--device', default='cpu', help='device to train on (default: cpu)')
    parser.add_argument('--dry-run', action='store_true',
                        help='quickly check a single pass')
    parser.add_argument('--seed', type=int, default=1, metavar='S',
                        help='random seed (default: 1)')
    parser.add_argument('--log-interval', type=int, default=4, metavar='N',
                        help='how many batches to wait before logging training status')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    fg.manual_seed(args.seed)
    device = args.device

    train_loader = NumpyLoader(*synthetic_mnist(args.train_size, seed=1), args.batch_size, shuffle=True,
                               seed=args.seed)
    test_loader = NumpyLoader(*synthetic_mnist(512, seed=2), args.test_batch_size)

    model = Net().to(device)
    optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        test(model, device, test_loader)
        scheduler.step()


if __name__ == '__main__':
    main()
