"""The serving process's life: what `reef serve` runs around the API rooms of `reef.server`.

run.py starts the engine, the background jobs and uvicorn, and closes them in order. Each job
runs on its own loop: the head follower (follower.py) swaps each scenario's binding when its
head moves, and a replica's remote follower (remote_follower.py) keeps its copy of the shared
release chain up to date; the canary judge (canary_judge.py) promotes or rolls back running
canaries on their reports, the shadow runner (shadow.py) has shadow candidates answer copies of
live calls on idle capacity, and the recovery (recovery.py) ends the evaluations a process that
died left behind. learner.py is the learning worker's own process, which `reef serve` starts.
Each reads the serving state; serving knows none of them (the state knows the shadow runner
only by a protocol).
"""
