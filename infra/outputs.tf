# orch reads these (`terraform output -json`); keep the names stable.

output "region" {
  description = "Region the network is in."
  value       = var.region
}

output "vpc_id" {
  description = "ID of the VPC."
  value       = aws_vpc.this.id
}

output "subnet_ids" {
  description = "Public subnet ID per availability zone: { \"us-east-1a\" = \"subnet-...\", ... }."
  value       = { for zone, subnet in aws_subnet.zone : zone => subnet.id }
}

output "security_group_id" {
  description = "ID of the security group to put every node in."
  value       = aws_security_group.nodes.id
}

output "key_name" {
  description = "Name of the EC2 key pair to launch nodes with."
  value       = aws_key_pair.orch.key_name
}

output "instance_profile" {
  description = "Instance profile of the nodes of kept clusters with a checkpoint store (and of every job's without node_job_policy); empty without checkpoint_store."
  value       = local.with_store == 1 ? aws_iam_instance_profile.node[0].name : ""

  precondition {
    condition     = local.with_store == 1 || length(var.data_sources) + length(var.output_destinations) == 0
    error_message = "data_sources and output_destinations are granted to the nodes' roles, which are made only with checkpoint_store: set checkpoint_store too, or empty both lists."
  }
}

output "node_job_policy" {
  description = "ARN of the policy of each job's own node role (aws.node_job_policy); empty without checkpoint_store."
  value       = local.with_store == 1 ? aws_iam_policy.node_job[0].arn : ""
}

output "controller_instance_profile" {
  description = "Instance profile of the controller host (aws.controller_instance_profile); empty without controller_host."
  value       = local.with_controller == 1 ? aws_iam_instance_profile.controller[0].name : ""
}
