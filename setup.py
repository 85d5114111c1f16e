from setuptools import find_packages, setup

setup(
    name="phalanx",
    version="0.1.0",
    description="Train PyTorch image models on one GPU, many GPUs or many machines, and watch the losses live.",
    packages=find_packages(include=["phalanx", "phalanx.*"]),
    package_data={"phalanx": ["data/*.csv.gz", "data/*.md"]},
    python_requires=">=3.11",
    install_requires=[
        "torch>=2.4",
        "torchvision>=0.19",
        "click>=8.1",
        "pyyaml>=6",
        "visdom>=0.2.4",
        "tornado<6.6",  # 6.6 makes visdom 0.2.4's page answer 403
        "boto3>=1.28",
        "pycocotools>=2.0.7",  # --task detect's COCO mAP
        "scipy>=1.10",  # --task deepliif's cell counts (connected components)
        "tifffile>=2025.1",
        "zarr>=3.0",
        "imagecodecs>=2025.3",  # whole slides read and written region by region
    ],
    extras_require={
        "timm": ["timm>=1.0"],  # --model timm/NAME
        "test": [
            "pytest>=8",
            "pytest-timeout>=2",
            "moto[server]>=5",
            "playwright>=1.40",
            "hypothesis>=6",
            "timm>=1.0",  # --model timm/NAME
            "lightly>=1.5",  # the reference NT-Xent that --task simclr is compared with
            # deepliif test's own imports (tests/deepliif_cli.py runs DeepLIIF's cli.py as a process)
            "numba>=0.60",
            "scikit-image>=0.24",
            "opencv-python-headless>=4.8",
            "dask>=2024.1",
            "dominate>=2.8",
            "requests>=2.31",
            # scripts/lint.sh (versions pinned in constraints.txt: a formatter's style moves between releases)
            "ruff>=0.6",
            "mypy>=1.10",
            "import-linter>=2.0",
            "grimp>=3.0",
        ],
    },
    entry_points={"console_scripts": ["phalanx=phalanx.cli:entry"]},
)
