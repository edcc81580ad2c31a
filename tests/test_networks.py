"""networks/: the ImageNet stem of our ResNets, timm's models by name, and every method's step on a tiny
ViT: gradient caching equals the plain step (a ViT has no BatchNorm, so this holds in train mode too)."""
import pytest
import torch
from test_steps import CASES, assert_grads_equal

from helpers import build_training, step_batch, take_steps
from networks import MODELS, SupConResNet, build_encoder, parse_model_args

TINY_VIT = ['--model', 'timm:vit_tiny_patch16_224', '--model_args', 'depth=1,patch_size=8,embed_dim=32,num_heads=2']


@pytest.mark.parametrize('name', sorted(MODELS))
def test_imagenet_stem_quarters_the_resolution(name):
    """The ImageNet stem (7x7 conv of stride 2, 3x3 max-pool of stride 2) gives the CIFAR stem's features of an image
    a quarter the size in each side; the same weights fit both but the first convolution's."""
    imagenet, dim = build_encoder(name, stem='imagenet')
    cifar, dim_c = build_encoder(name, stem='cifar')
    assert dim == dim_c == imagenet.feature_dim and imagenet.conv1.kernel_size == (7, 7)
    assert imagenet.conv1.stride == (2, 2) and isinstance(imagenet.pool, torch.nn.MaxPool2d)
    x = torch.randn(2, 3, 64, 64)
    assert imagenet.eval()(x).shape == (2, dim)
    plain = {k for k in cifar.state_dict()}
    assert plain == set(imagenet.state_dict())          # no new weights: old checkpoints load into the CIFAR stem
    with pytest.raises(ValueError):
        build_encoder(name, stem='other')


def test_timm_models_by_name_without_downloads():
    """``timm:<name>`` builds timm's model without pretrained weights and without its classifier, the feature width
    read from the model; a ViT is built for the run's image size; unknown names and arguments are errors."""
    vit, dim = build_encoder('timm:vit_tiny_patch16_224', size=16, model_args='depth=1,patch_size=8')
    assert dim == 192 == vit.feature_dim and vit(torch.randn(2, 3, 16, 16)).shape == (2, 192)
    convnet, dim = build_encoder('timm:resnet18', size=16)        # no image size argument: built without it
    assert dim == 512 and convnet(torch.randn(2, 3, 16, 16)).shape == (2, 512)
    model = SupConResNet('timm:vit_tiny_patch16_224', feat_dim=8, size=16, model_args='depth=1,patch_size=8')
    assert model.dim == 192 and model(torch.randn(2, 3, 16, 16)).shape == (2, 8)
    assert parse_model_args('depth=2, drop_rate=0.1,global_pool=avg,qkv_bias=false') == {
        'depth': 2, 'drop_rate': 0.1, 'global_pool': 'avg', 'qkv_bias': False}
    for bad in ('depth', '=2', '2x=1'):
        with pytest.raises(ValueError):
            parse_model_args(bad)
    with pytest.raises(ValueError):
        build_encoder('timm:no_such_model')
    with pytest.raises(ValueError):
        build_encoder('resnet18', model_args='depth=2')


@pytest.mark.parametrize('case', sorted(CASES))
def test_every_method_trains_a_vit_and_chunks_equal_the_plain_step(case):
    """Every method (and CE) takes a step on a tiny ViT built as the scripts build it, and gradient caching
    gives the plain step's gradients in train mode (no BatchNorm couples the samples of a chunk)."""
    def run(chunk):
        training = build_training([*CASES[case], *TINY_VIT], ce=case.startswith('CE'), chunk=chunk, train=True,
                                  scripts_model=True)
        return take_steps(training, *step_batch(0), seed=1)
    loss, _, grads = run(0)
    loss_c, _, grads_c = run(5)
    assert torch.isfinite(loss) and any(name.startswith('encoder.blocks') for name in grads)
    torch.testing.assert_close(loss_c, loss, rtol=1e-5, atol=1e-6)
    assert_grads_equal(grads_c, grads, case)


def test_model_args_timm_rejects_are_one_line_naming_the_argument_and_the_model(tmp_path):
    """Arguments passed through to timm: a bad value or an unknown key was a raw TypeError from timm;
    now one line naming the argument and the model, before anything is built."""
    from helpers import assert_one_line_error, run_in_process
    vit = ['--model', 'timm:vit_tiny_patch16_224', '--epochs', 1, '--save_folder', tmp_path]
    for args, words in (('depth=two', ('depth=two', 'timm:vit_tiny_patch16_224')),
                        ('nosuchkwarg=3', ('nosuchkwarg is not an argument of timm:vit_tiny_patch16_224',)),
                        ('depth=1,nosuchkwarg=3', ('nosuchkwarg', 'vit_tiny'))):
        for script in ('main_supcon.py', 'main_ce.py'):
            assert_one_line_error(run_in_process(script, *vit, '--model_args', args), *words)


def test_timm_problem_is_none_for_a_model_that_builds_and_runs():
    from networks import timm_problem
    assert timm_problem('vit_tiny_patch16_224', 16, 'depth=1,patch_size=4,dynamic_img_size=true', (8,)) is None
    assert 'cannot take 6 x 6' in timm_problem('vit_tiny_patch16_224', 16,
                                               'depth=1,patch_size=4,dynamic_img_size=true', (6,))
