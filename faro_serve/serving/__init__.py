"""The Ray Serve shell: model applications (router front, direct path), plain Ray Serve
(``ray-native``) and the autoscaler deployment; the only layer that imports Ray Serve."""
