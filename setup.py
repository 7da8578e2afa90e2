from setuptools import find_packages, setup

setup(
    name="parallax",
    version="0.1.0",
    description="Automatic data-parallel training of TensorFlow graphs written for one device",
    packages=find_packages(include=["parallax", "parallax.*", "runner", "runner.*"]),
    python_requires=">=3.10",
    # horovod is built from source by scripts/bootstrap.sh against the installed TensorFlow.
    # TensorFlow is not listed: a CPU machine uses tensorflow-cpu, a GPU cluster tensorflow.
    install_requires=["numpy", "grpcio", "psutil", "tqdm"],
)
