"""publish: copy a checkpoint so it appears whole or not at all, then move the tracker."""
