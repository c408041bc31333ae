"""The small shop of ``keel bridge sample-data``: fifteen services along four request
routes, the services incidents are injected into, and the words of its deploy log."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ANCESTORS",
    "AUTHORS",
    "BAD_DEPLOY_TARGETS",
    "BAD_NOTES",
    "CONFIG_NOTES",
    "CONFIG_TARGETS",
    "RELEASE_NOTES",
    "ROUTES",
    "SATURATION_TARGETS",
    "SERVICES",
    "SIGMA",
    "Node",
    "route_median",
]


@dataclass(frozen=True)
class Node:
    """One call in a request route: a span of ``service`` and the calls it makes."""

    service: str
    operation: str
    median_ms: float  # the span's own work, log-normal around this
    children: tuple[tuple[Node, float], ...] = ()  # (call, probability it happens)


def _n(service: str, op: str, ms: float, *children: tuple[Node, float]) -> Node:
    return Node(service, op, ms, tuple(children))


ROUTES: tuple[tuple[Node, float], ...] = (
    (
        _n(
            "web-frontend",
            "POST /checkout",
            8,
            (
                _n(
                    "checkout",
                    "PlaceOrder",
                    6,
                    (_n("cart", "GetCart", 3, (_n("cart-cache", "GET cart", 1.0), 1.0)), 1.0),
                    (
                        _n("inventory", "Reserve", 4, (_n("inventory-db", "UPDATE stock", 3), 1.0)),
                        1.0,
                    ),
                    (
                        _n(
                            "payments",
                            "Charge",
                            5,
                            (_n("fraud-check", "Score", 12), 1.0),
                            (_n("card-gateway", "Authorize", 140), 1.0),
                        ),
                        1.0,
                    ),
                    (_n("notifications", "SendReceipt", 4), 0.6),
                ),
                1.0,
            ),
        ),
        0.25,
    ),
    (
        _n(
            "web-frontend",
            "GET /search",
            6,
            (
                _n(
                    "search",
                    "Query",
                    5,
                    (_n("search-index", "Search", 25), 1.0),
                    (
                        _n(
                            "catalog",
                            "GetProducts",
                            3,
                            (_n("catalog-db", "SELECT products", 4), 1.0),
                        ),
                        1.0,
                    ),
                ),
                1.0,
            ),
        ),
        0.30,
    ),
    (
        _n(
            "web-frontend",
            "GET /product",
            5,
            (_n("catalog", "GetProduct", 3, (_n("catalog-db", "SELECT product", 3), 1.0)), 1.0),
            (
                _n(
                    "recommendations", "ForProduct", 8, (_n("catalog-db", "SELECT related", 5), 1.0)
                ),
                0.8,
            ),
        ),
        0.30,
    ),
    (
        _n(
            "web-frontend",
            "POST /cart",
            5,
            (
                _n(
                    "cart",
                    "AddItem",
                    3,
                    (_n("cart-cache", "SET cart", 1.0), 1.0),
                    (
                        _n("inventory", "Check", 3, (_n("inventory-db", "SELECT stock", 2), 1.0)),
                        1.0,
                    ),
                ),
                1.0,
            ),
        ),
        0.15,
    ),
)


def _walk(node: Node, parents: tuple[str, ...], out: dict[str, set[str]]) -> None:
    out.setdefault(node.service, set()).update(parents)
    for child, _ in node.children:
        _walk(child, (*parents, node.service), out)


ANCESTORS: dict[str, set[str]] = {}
for _route, _ in ROUTES:
    _walk(_route, (), ANCESTORS)
SERVICES = tuple(sorted(ANCESTORS))
SIGMA = {"card-gateway": 0.7}  # log-normal shape of a span's own time; 0.35 elsewhere
BAD_DEPLOY_TARGETS = (
    "cart",
    "inventory",
    "payments",
    "fraud-check",
    "search",
    "catalog",
    "recommendations",
)
SATURATION_TARGETS = (
    "inventory-db",
    "cart-cache",
    "catalog-db",
    "search-index",
    "card-gateway",
    "fraud-check",
)
CONFIG_TARGETS = (  # (service whose client timeout changes, the dependency it calls)
    ("payments", "card-gateway"),
    ("checkout", "inventory"),
    ("search", "search-index"),
    ("catalog", "catalog-db"),
    ("cart", "cart-cache"),
    ("recommendations", "catalog-db"),
)
AUTHORS = ("a.silva", "j.chen", "m.kowalski", "r.okafor", "s.haddad", "t.nguyen", "k.berg")
RELEASE_NOTES = (
    "bump logging library",
    "refactor request metrics",
    "feature flag cleanup",
    "upgrade HTTP client",
    "add tracing attributes",
    "copy changes on the order page",
    "tune connection pool metrics",
    "dependency updates",
)
CONFIG_NOTES = (
    "config: raise log sampling to 5%",
    "config: rotate API credentials",
    "config: enable canary routing for 5% of traffic",
    "config: adjust cache TTL from 60s to 90s",
)
BAD_NOTES = (
    "switch to the new pricing client",
    "migrate to async database driver",
    "new retry policy for downstream calls",
    "rewrite request validation",
)


def route_median(service: str) -> float:
    """Median total time of a call to ``service`` (its own time plus its callees')."""
    for route, _ in ROUTES:
        found = _find(route, service)
        if found is not None:
            return _total(found)
    raise KeyError(service)


def _find(node: Node, service: str) -> Node | None:
    if node.service == service:
        return node
    for child, _ in node.children:
        found = _find(child, service)
        if found is not None:
            return found
    return None


def _total(node: Node) -> float:
    return node.median_ms + sum(_total(c) * p for c, p in node.children)
