"""What runs inside Ray's worker processes for Fray: a callable job's replicas
(:mod:`fray.ray.inside._worker`), the class that hosts a Fray actor as a Ray actor
(:mod:`fray.ray.inside._actor_host`), and how an actor that ended itself says so
(:mod:`fray.ray.inside._actor_end`).
"""
