"""One topic resolution for the node and replay: compressed suffix, namespace, slashes."""

from __future__ import annotations

import pytest

from molmoact2_ros.control.params import Settings
from molmoact2_ros.control.topics import image_topic, input_topics, resolve, subscription_topics
from molmoact2_ros.errors import MolmoActError


@pytest.mark.parametrize("name,namespace,want", [
    ("camera/agentview/image", "", "/camera/agentview/image"),
    ("camera/agentview/image", "/robot1", "/robot1/camera/agentview/image"),
    ("camera/agentview/image", "robot1/", "/robot1/camera/agentview/image"),
    ("/camera/agentview/image", "/robot1", "/camera/agentview/image"),
    ("//camera//wrist/image/", "", "/camera/wrist/image"),
    ("joint_states", "/a/b", "/a/b/joint_states"),
])
def test_resolve(name, namespace, want):
    assert resolve(name, namespace) == want


@pytest.mark.parametrize("name", ["", "~/image", "/"])
def test_unusable_names_are_refused(name):
    with pytest.raises(MolmoActError, match="topic"):
        resolve(name)


@pytest.mark.parametrize("name,compressed,want", [
    ("cam/image", False, "cam/image"),
    ("cam/image", True, "cam/image/compressed"),
    ("cam/image/", True, "cam/image/compressed"),
    ("cam/image/compressed", True, "cam/image/compressed"),
    ("cam/imagecompressed", True, "cam/imagecompressed/compressed"),
])
def test_image_topic(name, compressed, want):
    assert image_topic(name, compressed) == want


def test_node_and_replay_names_agree():
    s = Settings().with_changes({"compressed_images": True, "topics.joint_states": "/js"})
    assert subscription_topics(s) == ["camera/agentview/image/compressed",
                                      "camera/wrist/image/compressed", "/js"]
    assert input_topics(s, "ns") == ["/ns/camera/agentview/image/compressed",
                                     "/ns/camera/wrist/image/compressed", "/js"]
