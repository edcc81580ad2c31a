"""CIFAR-stem ResNets and the heads SupContrast puts on them."""
from .resnet_big import MODELS, LinearClassifier, SupCEResNet, SupConResNet, build_encoder

__all__ = ['MODELS', 'LinearClassifier', 'SupCEResNet', 'SupConResNet', 'build_encoder']
