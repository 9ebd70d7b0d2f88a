"""The parts of `vgpud run`, which `vgpud.daemon` puts together and supervises.

- `checks`: what runs before Trio starts and fails the pod loudly (`Startup`, `check_node`);
- `build`: one builder per part (assigner, DRA driver, caches, registry, hot-plug, device health);
- `observability`: the readers of the node's state (metrics, debug endpoint, drift, usage);
- `parts`: `Node`, every part of one run, and `build_node`, which makes them in order;
- `serving`: the sockets the kubelet and the runtime reach (DRA, registration, health, NRI);
- `names`: the file names and the component names (the health, log and metrics labels).
"""
