#!/usr/bin/env bash
# The suite under the sourced ROS 2, rclpy and launch tests included: colcon-builds the package
# into ROS_WS (its src/ links this checkout), sources the install (the generated messages import
# from there) and runs pytest with the project's venv, on localhost DDS in a domain of its own.
#   VENV=.venv ROS_WS=.cache/ros_ws bash tests/ros_suite.sh [pytest options] [tests/...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$(cd "$root" && cd "${VENV:-.venv}" && pwd)
ws=$(mkdir -p "$root/${ROS_WS:-.cache/ros_ws}/src" && cd "$root/${ROS_WS:-.cache/ros_ws}" && pwd)
if [[ -z ${ROS_DISTRO:-} ]]; then
  echo "no ROS 2 sourced: source /opt/ros/<distro>/setup.bash first (CONTRIBUTING.md)" >&2
  exit 2
fi
if ! command -v colcon >/dev/null; then
  echo "colcon not found: apt install python3-colcon-common-extensions" \
    "(or pip install colcon-common-extensions)" >&2
  exit 2
fi
ln -sfn "$root" "$ws/src/molmoact2_ros"
start=$(date +%s)
if ! (cd "$ws" && colcon build --symlink-install --base-paths src \
        --packages-select molmoact2_ros >"$ws/colcon_build.log" 2>&1); then
  tail -n 40 "$ws/colcon_build.log" >&2
  echo "colcon build failed: the whole log is $ws/colcon_build.log" >&2
  exit 1
fi
echo "== make: colcon build into ${ROS_WS:-.cache/ros_ws} in $(( $(date +%s) - start )) s"
set +u  # ROS's setup scripts read unset variables
# shellcheck disable=SC1091
source "$ws/install/setup.bash"
set -u
export RMW_IMPLEMENTATION=rmw_cyclonedds_cpp ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
# a domain per run, so that two runs on one machine never see each other's nodes
export ROS_DOMAIN_ID=$(( 100 + RANDOM % 100 ))
# the nodes the tests launch (#!/usr/bin/env python3) run with the venv's interpreter
export PATH="$venv/bin:$PATH"
# paths given relative to the checkout, as make passes them
args=()
for a in "$@"; do
  if [[ $a != -* && -e $root/$a ]]; then args+=("$ws/src/molmoact2_ros/$a"); else args+=("$a"); fi
done
if ! printf '%s\n' "${args[@]+"${args[@]}"}" | grep -q "^$ws/src/molmoact2_ros/"; then
  args+=("$ws/src/molmoact2_ros/tests")
fi
echo "== make: pytest from the colcon install (ROS 2 $ROS_DISTRO, ROS_DOMAIN_ID=$ROS_DOMAIN_ID," \
  "$RMW_IMPLEMENTATION on localhost)"
cd "$ws"  # not the checkout: molmoact2_ros must import from the install
exec "$venv/bin/python" -m pytest "${args[@]}"
