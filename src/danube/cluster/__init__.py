"""Cluster-level logic shared by the broker and offline jobs: load reports and load scoring."""
