"""What a measurement changes in a block: a swap installs itself on a block and undoes itself (``base``);
``AttentionSwap`` routes the attention through a registry backend (``attention``); ``backends`` picks them."""
