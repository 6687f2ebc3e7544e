variable "region" {
  description = "AWS region to build the network in (orch launches nodes there). Example: us-east-1."
  type        = string
  default     = "us-east-1"
}

variable "availability_zones" {
  description = <<-EOT
    Availability zones of `region` that get one public subnet each. orch places all nodes of a
    job in one zone and fails over to the next one on a capacity error, so list every zone you
    want it to try. Empty (the default) means every zone AWS reports as available in the region.
  EOT
  type        = list(string)
  default     = []

  validation {
    condition     = length(var.availability_zones) == length(distinct(var.availability_zones))
    error_message = "availability_zones must not repeat a zone."
  }
}

variable "name" {
  description = "Prefix of every resource name (Name tag, security group name)."
  type        = string
  default     = "orch"

  validation {
    condition     = can(regex("^[a-zA-Z0-9][a-zA-Z0-9-]{0,30}$", var.name))
    error_message = "name must be 1-31 letters, digits or dashes, starting with a letter or digit."
  }
}

variable "owner" {
  description = "Value of the `orch-owner` tag put on every resource, so what orch owns can be found without its database."
  type        = string
  default     = "orch"
}

variable "vpc_cidr" {
  description = "IPv4 CIDR of the VPC. Each zone's subnet is a /20 carved out of it (a /16 holds 16 zones; a smaller VPC gets smaller subnets)."
  type        = string
  default     = "10.42.0.0/16"

  validation {
    condition     = can(cidrhost(var.vpc_cidr, 0)) && tonumber(split("/", var.vpc_cidr)[1]) <= 24
    error_message = "vpc_cidr must be an IPv4 CIDR block of size /24 or larger, e.g. 10.42.0.0/16."
  }
}

variable "ssh_cidr_blocks" {
  description = <<-EOT
    IPv4 CIDR blocks allowed to reach SSH (port 22) on the nodes: the machine that runs orch,
    e.g. ["203.0.113.7/32"]. No default on purpose: you must choose who may connect.
  EOT
  type        = list(string)

  validation {
    condition     = length(var.ssh_cidr_blocks) > 0 && alltrue([for c in var.ssh_cidr_blocks : can(cidrnetmask(c))])
    error_message = "ssh_cidr_blocks must hold at least one IPv4 CIDR block, e.g. [\"203.0.113.7/32\"]."
  }
}

variable "ssh_from_anywhere" {
  description = "Consent to an ssh_cidr_blocks entry of 0.0.0.0/0 (refused without it: anyone could try to log into the nodes)."
  type        = bool
  default     = false
}

variable "key_name" {
  description = "Name of the EC2 key pair to create; orch launches nodes with it."
  type        = string
  default     = "orch"
}

variable "ssh_public_key" {
  description = "OpenSSH public key (one line, e.g. the contents of ~/.ssh/id_ed25519.pub) imported as the key pair; orch connects with the matching private key."
  type        = string

  validation {
    condition     = can(regex("^(ssh-rsa|ssh-ed25519|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]+", trimspace(var.ssh_public_key)))
    error_message = "ssh_public_key must be one OpenSSH public key line starting with ssh-rsa, ssh-ed25519 or ecdsa-sha2-*."
  }
}

variable "tags" {
  description = "Extra tags for every resource (orch-owner and Name are always set)."
  type        = map(string)
  default     = {}
}

variable "checkpoint_store" {
  description = <<-EOT
    The checkpoint store of your jobs, s3://bucket/prefix (the job spec's checkpoint.store).
    When set, an IAM role that may read and write only that prefix, and an instance profile
    holding it (output `instance_profile`), are made for the nodes. Empty: none is made.
  EOT
  type        = string
  default     = ""

  validation {
    condition     = var.checkpoint_store == "" || can(regex("^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$", var.checkpoint_store))
    error_message = "checkpoint_store must be empty or s3://bucket/prefix."
  }
}

variable "data_sources" {
  description = <<-EOT
    Buckets the jobs' data comes from (`data[].src: s3://...`), each s3://bucket or
    s3://bucket/prefix: the nodes' roles (each job's own and the shared one) may read the object
    named by the prefix and every object under prefix/, and list the bucket under prefix/ only
    (the whole bucket without a prefix). Needs checkpoint_store. Empty: no such grant.
  EOT
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for url in var.data_sources : can(regex("^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^/*?$[:cntrl:]]+)*/?$", url)) && !can(regex("/\\.{1,2}(/|$)", url))])
    error_message = "data_sources must hold s3://bucket or s3://bucket/prefix URLs only: no *, ?, $ or control characters (IAM would read them as wildcards or variables), no empty, . or .. parts."
  }
}

variable "output_destinations" {
  description = <<-EOT
    Buckets the jobs' outputs go to (`outputs[].dst: s3://...`), each s3://bucket or
    s3://bucket/prefix: the nodes' roles may write (and abort the uploads of) objects under
    prefix/ only (anywhere in the bucket without a prefix); never read or delete them. Needs
    checkpoint_store. Empty: no such grant.
  EOT
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for url in var.output_destinations : can(regex("^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^/*?$[:cntrl:]]+)*/?$", url)) && !can(regex("/\\.{1,2}(/|$)", url))])
    error_message = "output_destinations must hold s3://bucket or s3://bucket/prefix URLs only: no *, ?, $ or control characters (IAM would read them as wildcards or variables), no empty, . or .. parts."
  }
}

variable "controller_host" {
  description = <<-EOT
    Make the controller host's credentials (`orch controller up --provider aws`): an IAM role
    that may launch, tag and end only instances tagged orch-owner = owner, make and delete
    their clusters' security groups in this VPC (plus the reads EC2 cannot narrow), pass the
    nodes' role and prune the checkpoint store's prefix when checkpoint_store is set, in an
    instance profile (output `controller_instance_profile`).
  EOT
  type        = bool
  default     = false
}
