"""What an Allocate (or a DRA prepare) may plan on without reading it again.

- **Claims**: the document of a card this process last read or wrote (`ClaimsStore.last`), while
  the claims watch has delivered no newer revision of it. Only the allocator adds claims, and its
  own writes are in that document the moment they land, so what the view can miss is another
  writer's change of the last few milliseconds (the reclaimer's release or removal). A plan on it
  is checked by the compare-and-set of the claim write, which a stale revision fails; the store
  then reads afresh.
- **Instances**: the cards' instances as this process last enumerated them, while no claim
  revision has moved and this process has not asked the driver to change a card since. Another
  service destroys an instance only between two claim writes (the reclaimer's release and
  removal), so the stamp moves with it. What it cannot see is a partition carved by hand in that
  window: the driver refuses a create over it (`PlacementError`), and the Allocate plans again on
  a fresh read.

Everything that concludes from what it read rather than writing against a revision reads
afresh: the recompute (what is advertised), a retried Allocate and a token kubelet handed on, the
room-making and the refusal's account. A plan on the views that finds no room is made again on a
fresh read before any of those.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from partkeeper.drivers import Instance

Enumeration = dict[int, tuple[Instance, ...]]


@dataclass
class Views:
    loaded: bool = False  # the claims watch has delivered every document present at its start
    revisions: dict[int, int] = field(default_factory=dict)  # card -> newest revision delivered
    moves: int = 0  # claim revisions delivered plus this process's own driver changes
    _enumerated: tuple[int, Enumeration] | None = None

    def saw(self, card: int, revision: int) -> None:
        """The claims watch delivered `revision` of the card's document."""
        if revision > self.revisions.get(card, 0):
            self.revisions[card] = revision
            self.moves += 1

    def replayed(self) -> None:
        self.loaded = True

    def lost(self) -> None:
        """The watch lost its place: nothing is current until its next replay has come."""
        self.loaded = False
        self.moves += 1

    def current(self, card: int, revision: int) -> bool:
        """Whether a document of the card at `revision` is the newest the watch has shown."""
        return self.loaded and revision >= self.revisions.get(card, 0)

    def changed_hardware(self) -> None:
        """This process asked the driver to create or destroy (whatever came of it)."""
        self.moves += 1

    def stamp(self) -> int:
        """Taken before an enumeration starts: a move during it makes the result stale."""
        return self.moves

    def enumerated(self, stamp: int, instances: Enumeration | None) -> None:
        """The result of an enumeration started at `stamp`; None: it failed, and nothing is
        planned on the views' instances until one succeeds (invariant 9)."""
        self._enumerated = None if instances is None else (stamp, instances)

    def instances(self) -> Enumeration | None:
        """The last enumeration, if nothing has moved since it started."""
        if self.loaded and self._enumerated is not None and self._enumerated[0] == self.moves:
            return self._enumerated[1]
        return None
