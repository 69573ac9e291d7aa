from setuptools import find_packages, setup

setup(
    name='vit-pytorch-clean',
    version='0.1.0',
    description='Vision Transformers in PyTorch and einops: faithful to the papers, loadable from real checkpoints, tested',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    license='MIT',
    packages=find_packages(exclude=['tests', 'tests.*', 'benchmarks']),
    python_requires='>=3.10',
    install_requires=[
        'torch>=2.4',
        'einops>=0.8',
        # the models never touch numpy, but `import torch` itself warns "Failed to initialize NumPy" without it
        # (torch 2.13.0, torch/_subclasses/functional_tensor.py), and torch's wheel does not bring it
        'numpy',
    ],
    extras_require={
        'test': ['pytest', 'hypothesis', 'numpy', 'scikit-learn', 'safetensors', 'pillow', 'matplotlib', 'tqdm',
                 'onnx', 'onnxscript', 'onnxruntime'],
        'export': ['onnx', 'onnxscript', 'onnxruntime'],
        'train': ['tqdm', 'safetensors', 'scikit-learn', 'matplotlib', 'pillow'],
        'pretrained': ['safetensors', 'numpy'],
        'plots': ['matplotlib'],
        # the UCR/UEA time-series sets ship inside aeon (vit_pytorch.ucr); aeon needs Python >= 3.11
        'timeseries': ['aeon; python_version >= "3.11"'],
    },
    entry_points={
        'console_scripts': [
            'vit-train = vit_pytorch.train:main',
            'vit-evaluate = vit_pytorch.evaluate:main',
        ],
    },
)
