"""The watcher: lists and watches the node's Pods, announces Seen/Finished/Gone on PK_PODS,
keeps the view in pk-pods and answers pods.get and pods.pending. See docs/watcher.md."""
