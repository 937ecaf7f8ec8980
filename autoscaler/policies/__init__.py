"""The comparison systems as policies: the paper's baselines and Ray Serve's rule
(``baselines``, ``ray_rule``), Swayam, INFaaS and InferLine (``seeds``, ``inferline``),
Sponge (``sponge``), and what several of them share (``common``). Faro has a floor of its
own (``autoscaler.faro``)."""
