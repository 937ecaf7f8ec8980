"""The contract between a policy and its drivers (paper 4.4, 6.4): what a policy sees each
tick (:class:`~autoscaler.contract.policy.Observation`), what it answers
(:class:`~autoscaler.contract.policy.Decision`, one :class:`~autoscaler.contract.setting.Setting`
per model) and the state it keeps across restarts (``state``). Imports nothing else of
``autoscaler``: every other floor builds on it."""
