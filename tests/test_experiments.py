"""The paper's experiments (`python -m vit_pytorch.experiments NAME`), each on a tiny grid of tiny models."""

import json

import pytest
import torch

from vit_pytorch import experiments
from vit_pytorch.evaluate import ImageSet
from vit_pytorch.position_embeddings import KINDS
from vit_pytorch.vit import ViT

pytest.importorskip('sklearn')
pytest.importorskip('matplotlib')
pytest.importorskip('safetensors')

# 8-pixel digits, one layer of width 16, one epoch of 6 steps
TINY = ['--image-size', '8', '--epochs', '1', '--batch-size', '256', '--dim', '16', '--heads', '2', '--dim-head', '8',
        '--mlp-dim', '32', '--quiet', '--threads', '1']


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def run(tmp_path, *argv):
    out = tmp_path / argv[0]
    assert experiments.main([*argv, *TINY, '--depth', '1', '--out', str(out)]) == 0
    saved = json.loads((out / 'results.json').read_text())
    picture = out / saved['picture']
    assert picture.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    return saved


def test_pooling_trains_both_pools_at_every_learning_rate(tmp_path):
    saved = run(tmp_path, 'pooling', '--lrs', '1e-3', '1e-2', '--seeds', '2')
    assert sorted((r['pool'], r['lr'], r['seed']) for r in saved['runs']) == sorted(
        (pool, lr, seed) for pool in ('cls', 'mean') for lr in (1e-3, 1e-2) for seed in (0, 1))
    for pool in ('cls', 'mean'):
        for point in saved['summary'][pool]:
            accuracies = [r['test_accuracy'] for r in saved['runs'] if (r['pool'], r['lr']) == (pool, point['lr'])]
            assert point['mean'] == pytest.approx(sum(accuracies) / 2)
        best = max(saved['summary'][pool], key=lambda point: point['mean'])['lr']
        assert saved['summary']['best_lr'][pool] == best


def test_positions_trains_every_kind_for_every_seed(tmp_path):
    saved = run(tmp_path, 'positions', '--seeds', '1')
    assert [r['position'] for r in saved['runs']] == list(KINDS)
    assert all(0 <= r['test_accuracy'] <= 1 for r in saved['runs'])
    assert set(saved['summary']) == set(KINDS)


def test_similarity_maps_the_learned_table_of_each_setting(tmp_path):
    saved = run(tmp_path, 'similarity', '--patch-sizes', '2', '4', '--weight-decays', '0', '1')
    grids = {(r['patch_size'], r['weight_decay']): r['grid'] for r in saved['runs']}
    assert grids == {(2, 0.0): [4, 4], (2, 1.0): [4, 4], (4, 0.0): [2, 2], (4, 1.0): [2, 2]}
    for record in saved['runs']:
        similarity = torch.tensor(record['similarity'])
        height, width = record['grid']
        assert similarity.shape == (height, width, height, width)
        # each patch is most like itself
        diagonal = torch.stack([similarity[i, j, i, j] for i in range(height) for j in range(width)])
        torch.testing.assert_close(diagonal, torch.ones_like(diagonal), atol=1e-5, rtol=0)


def test_structure_measures_row_and_column_likeness():
    # a table of one-hot rows concatenated with one-hot columns: patches in one row or one column have
    # cosine similarity 1/2, the others 0
    height, width = 3, 4
    table = torch.cat((torch.eye(height).repeat_interleave(width, dim=0), torch.eye(width).repeat(height, 1)), dim=1)
    table = torch.nn.functional.normalize(table, dim=-1)
    similarity = (table @ table.T).reshape(height, width, height, width)
    assert experiments.structure(similarity) == pytest.approx(0.5)
    assert experiments.structure(torch.ones(height, width, height, width)) == pytest.approx(0.0)


def test_transfer_pretrains_once_per_seed_and_fine_tunes_every_arm(tmp_path):
    saved = run(tmp_path, 'transfer', '--seeds', '2', '--shots', '2', '--finetune-epochs', '2', '--pre-logits-dim',
                '8')
    stages = sorted((r['stage'], r.get('arm'), r['seed']) for r in saved['runs'])
    assert stages == sorted([('pretrain', None, seed) for seed in (0, 1)] +
                            [('finetune', arm, seed) for arm in experiments.ARMS for seed in (0, 1)])
    assert (tmp_path / 'transfer' / 'pretrained-seed1' / 'model.safetensors').exists()
    assert set(saved['summary']['2_shots']) == set(experiments.ARMS)


def test_the_three_heads_of_transfer():
    def pretrained():
        torch.manual_seed(0)
        return ViT(image_size=8, patch_size=4, num_classes=5, dim=16, depth=1, heads=2, dim_head=8, mlp_dim=32,
                   channels=1, pre_logits_dim=12)

    zero_head = experiments.replace_head(pretrained(), 'zero_head', 3)
    assert isinstance(zero_head.to_latent, torch.nn.Identity)
    assert zero_head.mlp_head.weight.shape == (3, 16) and zero_head.mlp_head.weight.abs().max() == 0

    model = pretrained()
    hidden = model.to_latent[0].weight.clone()
    zero_last = experiments.replace_head(model, 'zero_last', 3)
    assert torch.equal(zero_last.to_latent[0].weight, hidden)
    assert zero_last.mlp_head.weight.shape == (3, 12) and zero_last.mlp_head.weight.abs().max() == 0

    random_last = experiments.replace_head(pretrained(), 'random_last', 3)
    assert torch.equal(random_last.to_latent[0].weight, hidden)
    assert random_last.mlp_head.weight.shape == (3, 12) and random_last.mlp_head.weight.abs().min() > 0
    assert random_last(torch.randn(2, 1, 8, 8)).shape == (2, 3)


def test_scaling_counts_flops_and_trains_a_part_of_the_data_for_as_many_steps(tmp_path):
    saved = run(tmp_path, 'scaling', '--widths', '16', '32', '--patch-sizes', '4', '--fractions', '0.5', '1')
    runs = {(r['fraction'], r['width']): r for r in saved['runs']}
    assert len(runs) == 4
    for fraction in (0.5, 1.0):
        assert runs[fraction, 32]['forward_flops'] > runs[fraction, 16]['forward_flops']
        assert runs[fraction, 32]['parameters'] > runs[fraction, 16]['parameters']
    full, half = runs[1.0, 16], runs[0.5, 16]
    assert (full['epochs'], half['epochs']) == (1, 2)
    labels = experiments.load_data(experiments.parse_args(['scaling', *TINY])[0]).train.labels
    assert half['train_images'] == sum(round(0.5 * n) for n in torch.bincount(labels).tolist())
    # the training FLOPs count every image of every epoch: the half set twice over costs as much as the whole once
    assert full['train_flops'] / full['train_images'] == pytest.approx(half['train_flops'] / half['train_images'] / 2)


def test_a_second_run_reuses_the_recorded_runs(tmp_path, monkeypatch):
    first = run(tmp_path, 'positions', '--seeds', '1', '--kinds', 'none', 'learned')

    def no_training(*args, **kwargs):
        raise AssertionError('a recorded run was trained again')

    monkeypatch.setattr(experiments, 'fit', no_training)
    second = run(tmp_path, 'positions', '--seeds', '1', '--kinds', 'none', 'learned')
    assert second['runs'] == first['runs']


def test_other_settings_start_afresh_with_overwrite(tmp_path):
    run(tmp_path, 'positions', '--seeds', '1', '--kinds', 'none')
    again = run(tmp_path, 'positions', '--seeds', '1', '--kinds', 'none', '--lr', '1e-3', '--overwrite')
    assert len(again['runs']) == 1 and again['settings']['lr'] == 1e-3


def test_subset_takes_classes_counts_and_fractions():
    labels = torch.tensor([0] * 10 + [1] * 6 + [2] * 4)
    data = ImageSet(torch.arange(20).float()[:, None, None, None], labels, ['a', 'b', 'c'])
    few = experiments.subset(data, [2, 1], per_class=3, seed=1)
    assert few.classes == ['c', 'b'] and few.labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert set(few.images.flatten().tolist()) <= set(range(10, 20))
    part = experiments.subset(data, [0, 1, 2], fraction=0.5)
    assert torch.bincount(part.labels).tolist() == [5, 3, 2]


def test_runs_on_a_folder_of_images(tmp_path):
    from PIL import Image

    for split, count in (('train', 6), ('val', 2)):
        for name, value in (('dark', 40), ('light', 210)):
            folder = tmp_path / 'images' / split / name
            folder.mkdir(parents=True)
            for index in range(count):
                Image.new('RGB', (12, 12), (value + index, value, value)).save(folder / f'{index}.png')
    saved = run(tmp_path, 'pooling', '--lrs', '1e-3', '--data', str(tmp_path / 'images'))
    assert len(saved['runs']) == 2 and saved['settings']['data'] == str((tmp_path / 'images').resolve())


def test_bad_grids_are_refused(capsys):
    for argv in (['scaling', '--fractions', '0'], ['scaling', '--widths', '24'], ['transfer', '--shots', '0'],
                 ['positions', '--seeds', '0']):
        with pytest.raises(SystemExit):
            experiments.parse_args(argv)
    assert '--seeds must be at least 1' in capsys.readouterr().err


def test_transfer_needs_two_halves_of_classes(tmp_path):
    data = experiments.Data(ImageSet(torch.rand(6, 1, 8, 8), torch.tensor([0, 1, 2] * 2), list('abc')),
                            ImageSet(torch.rand(3, 1, 8, 8), torch.tensor([0, 1, 2]), list('abc')),
                            mean=[0.5], std=[0.3], image_size=8, channels=1)
    args, kwargs = experiments.parse_args(['transfer', *TINY, '--out', str(tmp_path)])
    with pytest.raises(ValueError, match='at least 4 classes'):
        experiments.transfer(args, kwargs, data, None, 'cpu')
